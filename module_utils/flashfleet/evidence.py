"""Gather the evidence of one flashfleet run on one host, as one JSON document (schema 1).

The logic of the flashfleet_evidence module (roles/run_diagnosis/library/), which calls
`gather(params)` on the host; standard library only and no Ansible import, so the parsers and
`gather` run the same in tests and offline. Read-only: anything unreadable is recorded with the
reason, nothing raises except a bad parameter (EvidenceError).

What the trainer leaves on the host is read through the contract: status.json (`status.read`),
the last metrics record (`metrics.read`), checkpoints (`checkpoint.scan`: manifest, sizes,
sha256 on request, the weights' safetensors header), the venv against its lock (`locks.parse`,
`locks.compare`, `locks.LIST_INSTALLED_SCRIPT`). Host paths are parameters, never defaults here:
the run_diagnosis role passes them.

The document is what diagnose.yml stores as runs/<run>/<host>/evidence.json, what the
classifier (flashfleet.classify) reads, and the test fixture format (tests/fixtures/evidence/).
"""

from __future__ import annotations

import calendar
import csv
import io
import json
import os
import re
import shutil
import socket
import subprocess
import time

from .contract import checkpoint, layout, locks, metrics, safetensors
from .contract import status as run_status

SCHEMA = 1

# Parameters gather() needs: host paths, which the role always passes (its defaults).
REQUIRED = ("run", "output_dir", "config_dir", "venv", "lock")
# The others, as the module documents them. `unit` defaults to layout.unit_name(run).
DEFAULTS = {"unit": None, "journal_lines": 2000, "kernel_scan_lines": 20000, "kernel_keep_lines": 500,
            "command_timeout": 5.0, "checksum": False, "shm": "/dev/shm"}
METRICS_TAIL_BYTES = 65536
# Death records (deaths/) listed in the evidence, newest first kept.
DEATHS_KEEP = 50

UNIT_PROPERTIES = (
    "Type", "Restart", "NotifyAccess", "WatchdogUSec", "RestartPreventExitStatus", "OOMPolicy",
    "MemoryMax", "MemoryHigh", "MemoryCurrent", "LoadState", "ActiveState", "SubState", "Result",
    "ExecMainCode", "ExecMainStatus", "ExecMainPID", "MainPID", "NRestarts", "InvocationID",
    "ExecMainStartTimestamp", "ExecMainExitTimestamp", "ActiveEnterTimestamp", "InactiveEnterTimestamp",
    "StateChangeTimestamp", "ControlGroup", "StatusText", "StatusErrno", "FragmentPath", "UnitFileState",
    # the unit's limits beside its current counts: a thread that cannot start, a file that cannot open
    "TasksMax", "TasksCurrent", "LimitNOFILE", "LimitNPROC",
)

JOURNAL_FIELDS = (
    "MESSAGE", "MESSAGE_ID", "PRIORITY", "_PID", "_COMM", "_SYSTEMD_UNIT", "UNIT", "_SYSTEMD_INVOCATION_ID",
    "INVOCATION_ID", "EXIT_CODE", "EXIT_STATUS", "UNIT_RESULT", "SYSLOG_IDENTIFIER", "_TRANSPORT", "_BOOT_ID",
    "JOB_TYPE", "JOB_RESULT", "N_RESTARTS",
)

# Kernel lines worth keeping: the patterns of what explains a death, one kind a row.
KERNEL_INTEREST_PATTERNS = (
    r"oom-kill|Out of memory|oom_reaper|invoked oom-killer|Memory cgroup|Killed process|memory: usage",  # OOM
    r"NVRM|Xid|nvidia|GPU has fallen|Machine check|mce:",  # the GPU driver, the CPU
    r"segfault|general protection|traps:|hung_task|blocked for more than",  # processes that crashed or hung
    # filesystems: I/O errors, journal aborts, read-only remounts, XFS shutdowns, a full disk
    r"I/O error|EXT4-fs|XFS|Aborting journal|aborted journal|Remounting filesystem read-only|No space left",
    r"pids controller|fork rejected",  # the cgroup's task limit (TasksMax)
    r"AER:|PCIe Bus Error|pcieport",  # a PCIe link (a GPU's) that failed
    # the machine and the kernel itself: poisoned memory, EDAC, lockups, RCU stalls, NFS, Oops, panics
    # (the classifier's kernel catalogue reads them; its test checks that each sample is kept here)
    r"Memory failure|hardware memory corruption|EDAC|soft lockup|hard LOCKUP|rcu_\w+ .*stall|rcu: INFO"
    r"|nfs: server|Kernel panic|BUG: |Oops: |no killable processes",
)
KERNEL_INTEREST = re.compile("|".join(KERNEL_INTEREST_PATTERNS), re.IGNORECASE)

RE_DMESG_ISO = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](?P<frac>\d+))?(?P<tz>[+-]\d\d:?\d\d)?\s+(?P<msg>.*)$")
RE_DMESG_MONO = re.compile(r"^(?:<(?P<prio>\d+)>)?\[\s*(?P<mono>\d+\.\d+)\]\s?(?P<msg>.*)$")


class EvidenceError(ValueError):
    """A parameter gather() cannot work with (a missing host path, an invalid run name)."""


# ---------------------------------------------------------------------------------------------
# parsers (pure; tested on recorded text)


def parse_systemctl_show(text):
    """`systemctl show` output (key=value lines) as a dict of strings."""
    props = {}
    for line in text.splitlines():
        if "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = value
    return props


def parse_journal_json(text, limit=None):
    """`journalctl -o json` output (one object a line) as a list; bad lines are skipped."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    if limit is not None and len(entries) > limit:
        entries = entries[-limit:]
    return entries


def journal_message(entry):
    value = entry.get("MESSAGE")
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", errors="replace")
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)


def parse_dmesg_line(line, boot_time=None):
    """One `dmesg` line (`--time-format iso`, or the default `[ 12.345678] text`) as a journal-like entry.

    Times become __REALTIME_TIMESTAMP (microseconds, as a string) when they can be placed: ISO lines
    always, monotonic ones when the boot time is known.
    """
    line = line.rstrip("\n")
    if not line.strip():
        return None
    m = RE_DMESG_ISO.match(line)
    if m:
        tz = (m.group("tz") or "+00:00").replace(":", "")
        frac = (m.group("frac") or "0")[:6].ljust(6, "0")
        ts = time.strptime(m.group("ts") + tz, "%Y-%m-%dT%H:%M:%S%z")
        offset = int(tz[0] + "1") * (int(tz[1:3]) * 3600 + int(tz[3:5]) * 60)
        seconds = calendar.timegm(ts) - offset
        return {"__REALTIME_TIMESTAMP": str(seconds * 1_000_000 + int(frac)), "MESSAGE": m.group("msg"),
                "_TRANSPORT": "kernel", "_SOURCE": "dmesg"}
    m = RE_DMESG_MONO.match(line)
    if m:
        entry = {"MESSAGE": m.group("msg"), "_TRANSPORT": "kernel", "_SOURCE": "dmesg",
                 "_SOURCE_MONOTONIC_TIMESTAMP": str(int(float(m.group("mono")) * 1_000_000))}
        if boot_time is not None:
            entry["__REALTIME_TIMESTAMP"] = str(int((boot_time + float(m.group("mono"))) * 1_000_000))
        return entry
    return {"MESSAGE": line, "_TRANSPORT": "kernel", "_SOURCE": "dmesg"}


def kernel_interesting(text):
    return bool(KERNEL_INTEREST.search(text))


def venv_drift(locked, installed):
    """The venv ({name: version}) against the lock ({normalized name: version}, locks.parse), by
    the contract's rules (locks.compare: PEP 503 names, PEP 440 local labels), in the evidence's
    shape: (drift [{"name", "locked", "installed"}], missing [names], unlocked [names])."""
    drift, missing, unlocked = [], [], []
    for d in locks.compare(locked, installed):
        if d["locked"] is None:
            unlocked.append(d["package"])
        elif d["installed"] is None:
            missing.append(d["package"])
        else:
            drift.append({"name": d["package"], "locked": d["locked"], "installed": d["installed"]})
    return drift, missing, unlocked


def parse_nvidia_smi_csv(text, fields):
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if not row or len(row) != len(fields):
            continue
        rows.append({f: v.strip() for f, v in zip(fields, row, strict=True)})
    return rows


def parse_memory_events(text):
    """cgroup v2 memory.events / v1 memory.oom_control (`key value` lines) as {key: int}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def unit_cgroup_default(unit):
    prefix, _, _ = unit.partition("@")
    if "@" in unit:
        escaped = prefix.replace("-", "\\x2d")
        return f"/system.slice/system-{escaped}.slice/{unit}"
    return f"/system.slice/{unit}"


# ---------------------------------------------------------------------------------------------
# what the trainer leaves in the run directory (read through the contract)


def checkpoint_state(ckpt_dir, checksum=False):
    """Every checkpoint under ckpt_dir as checkpoint.scan judges it: `complete` (verify found no
    problem: manifest, sizes, sha256 when `checksum`, the weights' safetensors header),
    `incomplete` (with the problems), `in_progress` (a save's temp directory), `newest` complete."""
    state = {"dir": ckpt_dir, "readable": True, "error": None, "complete": [], "incomplete": [],
             "in_progress": [], "newest": None}
    try:
        os.listdir(ckpt_dir)
        scanned = checkpoint.scan(ckpt_dir, check_hashes=checksum)
    except OSError as exc:
        state.update(readable=False, error=f"{ckpt_dir}: {exc.strerror or exc}")
        return state
    for c in scanned:
        if c["in_progress"]:
            state["in_progress"].append({"name": c["name"], "step": c["step"], "pid": c["pid"],
                                         "mtime": _mtime(c["path"])})
            continue
        info = {"name": c["name"], "step": c["step"], "mtime": _mtime(c["path"]),
                "bytes": sum(_size(os.path.join(c["path"], n)) for n in checkpoint.PAYLOAD),
                "ok": not c["problems"], "problems": c["problems"]}
        weights = os.path.join(c["path"], checkpoint.WEIGHTS)
        if os.path.exists(weights):
            info["safetensors_ok"] = not safetensors.read_header(weights)[1]
        state["complete" if info["ok"] else "incomplete"].append(info)
    if state["complete"]:
        state["newest"] = max(state["complete"], key=lambda c: c["step"])
    return state


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def deaths_state(deaths_dir, keep=DEATHS_KEEP):
    """The deaths recorded on the host at the moment they happened (flashfleet-verdict@<run>,
    flashfleet.death), newest `keep`, oldest first: each record's name, path and verdict (its
    evidence.json stays on the host; diagnose.yml fetches it)."""
    out = {"dir": deaths_dir, "count": 0, "records": [], "truncated": False}
    try:
        names = sorted(n for n in os.listdir(deaths_dir) if not n.startswith("."))
    except FileNotFoundError:
        return out
    except OSError as exc:
        out["error"] = f"{deaths_dir}: {exc.strerror or exc}"
        return out
    names = [n for n in names if os.path.isdir(os.path.join(deaths_dir, n))]
    out["count"] = len(names)
    if len(names) > keep:
        names, out["truncated"] = names[-keep:], True
    for name in names:
        path = os.path.join(deaths_dir, name)
        rec = {"name": name, "path": path, "verdict": None, "error": None,
               "files": sorted(f for f in os.listdir(path) if not f.startswith("."))}
        try:
            with open(os.path.join(path, layout.DEATH_VERDICT)) as f:
                rec["verdict"] = json.load(f)
        except (OSError, ValueError) as exc:
            rec["error"] = f"{layout.DEATH_VERDICT}: {exc}"
        out["records"].append(rec)
    return out


def status_state(path):
    """status.json through the contract's reader: {"readable", "error", "path", "data"}."""
    try:
        return {"readable": True, "error": None, "path": path, "data": run_status.read(path)}
    except run_status.StatusError as exc:
        return {"readable": False, "error": str(exc), "path": path, "data": None}


def metrics_state(path, tail_bytes=METRICS_TAIL_BYTES):
    """The last record of metrics.jsonl (from its tail), its size and mtime."""
    try:
        records = metrics.read(path, tail_bytes=tail_bytes)
        size = os.path.getsize(path)
    except OSError as exc:
        return {"readable": False, "error": f"{path}: {exc.strerror or exc}", "path": path, "last": None}
    return {"readable": True, "error": None, "path": path, "last": records[-1] if records else None,
            "bytes": size, "mtime": _mtime(path)}


def free_space(path):
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    # inodes too: ENOSPC with space free is a filesystem out of inodes (f_files is 0 where a
    # filesystem has no fixed inode table, btrfs say: then nothing is said of them)
    return {"path": path, "measured_at": probe, "free_bytes": st.f_bavail * st.f_frsize,
            "total_bytes": st.f_blocks * st.f_frsize, "free_inodes": st.f_favail, "total_inodes": st.f_files}


def disk_state(output_dir, shm):
    """Free space of the run dir, of where its checkpoints really are (a symlink or a mount can put
    them on another filesystem, which is the one that fills during a save), and of /dev/shm."""
    disk = {"output_dir": free_space(output_dir), "shm": free_space(shm)}
    ckpt = os.path.join(output_dir, layout.CHECKPOINTS)
    real = os.path.realpath(ckpt)
    try:
        other_fs = os.path.exists(ckpt) and os.stat(real).st_dev != os.stat(output_dir).st_dev
    except OSError:
        other_fs = False
    if other_fs:
        disk["checkpoints"] = dict(free_space(real), path=ckpt, realpath=real)
    return disk


# ---------------------------------------------------------------------------------------------
# gatherers (touch the host)


class Host:
    def __init__(self, timeout=5.0):
        self.timeout = timeout
        self.env = dict(os.environ, LC_ALL="C", SYSTEMD_COLORS="0", SYSTEMD_PAGER="", PAGER="cat")

    def run(self, argv, timeout=None):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=self.env,
                               timeout=timeout or self.timeout, check=False)
            return p.returncode, p.stdout, p.stderr.strip()
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]}: timed out after {timeout or self.timeout} s"


def gather_unit(host, unit):
    argv = ["systemctl", "show", unit, "--no-pager", "-p", ",".join(UNIT_PROPERTIES)]
    # Microseconds: the exit times of a multi-node run's units are compared to name the first.
    rc, out, err = host.run(argv + ["--timestamp=us+utc"])
    if rc != 0:
        rc, out, err = host.run(argv)
    if rc != 0:
        return {"readable": False, "error": err or f"systemctl exit {rc}", "properties": {}}
    return {"readable": True, "error": None, "properties": parse_systemctl_show(out)}


def gather_journal(host, unit, lines):
    # -u matches _SYSTEMD_UNIT=, and systemd's own messages about the unit (_PID=1 + UNIT=),
    # coredumps (COREDUMP_UNIT=) and OBJECT_SYSTEMD_UNIT= (systemd's add_matches_for_unit).
    argv = ["journalctl", "-u", unit, "-o", "json", "--no-pager", "-q", "-n", str(lines),
            "--output-fields=" + ",".join(JOURNAL_FIELDS)]
    rc, out, err = host.run(argv)
    if rc != 0:
        return {"readable": False, "error": err or f"journalctl exit {rc}", "entries": [], "limit": lines, "truncated": False}
    entries = parse_journal_json(out, lines)
    if not entries and "insufficient permissions" in err:
        return {"readable": False, "error": err, "entries": [], "limit": lines, "truncated": False}
    return {"readable": True, "error": err or None, "entries": entries, "limit": lines,
            "truncated": len(entries) >= lines}


def gather_servers(host, run, lines):
    """The run's vLLM server units on the host (flashfleet-vllm@<run>-<i>, as systemd lists them,
    failed ones too): each one's record and journal, as the trainer unit's are gathered."""
    rc, out, err = host.run(layout.vllm_list_units_argv(run))
    if rc != 0:
        return {"readable": False, "error": err or f"systemctl exit {rc}", "units": []}
    return {"readable": True, "error": None,
            "units": [{"unit": name, "unit_props": gather_unit(host, name), "journal": gather_server_journal(host, name, lines)}
                      for name in layout.vllm_units_listed(run, out)]}


def gather_server_journal(host, unit, lines):
    """A server's journal: its last `lines` entries, plus systemd's own messages about it and the
    output of its last invocation that failed. A server that restarted and served on writes far
    more than the trainer (a line per request at least), which pushes its death out of any tail."""
    journal = gather_journal(host, unit, lines)
    if not journal["readable"]:
        return journal
    fields = "--output-fields=" + ",".join(JOURNAL_FIELDS)
    _rc, out, _err = host.run(["journalctl", "_PID=1", f"UNIT={unit}", "-o", "json", "--no-pager", "-q", "-n",
                               str(lines), fields])
    manager = parse_journal_json(out, lines)
    failed = [e.get("INVOCATION_ID") for e in manager if e.get("UNIT_RESULT") not in (None, "success")]
    if failed and failed[-1]:
        _rc, out, _err = host.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={failed[-1]}", "-o", "json", "--no-pager",
                                   "-q", "-n", str(lines), fields])
        manager += parse_journal_json(out, lines)
    def key(e):  # one entry, whichever query brought it
        return e.get("__REALTIME_TIMESTAMP"), e.get("_PID"), str(e.get("MESSAGE"))

    seen = {key(e) for e in journal["entries"]}
    extra = [e for e in manager if key(e) not in seen]
    if extra:
        journal["entries"] = sorted(journal["entries"] + extra, key=lambda e: int(e.get("__REALTIME_TIMESTAMP") or 0))
    return journal


def gather_kernel(host, since, scan, keep):
    """Kernel lines of interest since `since` (unix s), this boot and the previous one."""
    result = {"readable": False, "error": None, "source": None, "entries": [], "since": since, "scanned": 0,
              "previous_boot": {"readable": False, "error": None}}
    probe_rc, probe_out, probe_err = host.run(["journalctl", "-k", "-b", "0", "-n", "1", "-o", "json", "--no-pager", "-q"])
    journal_has_kernel = probe_rc == 0 and bool(parse_journal_json(probe_out))
    errors = []
    if journal_has_kernel:
        for boot in ("0", "-1"):
            argv = ["journalctl", "-k", "-b", boot, "-o", "json", "--no-pager", "-q", "-n", str(scan),
                    "--output-fields=MESSAGE,PRIORITY,_BOOT_ID,_TRANSPORT,SYSLOG_IDENTIFIER"]
            if since is not None:
                argv += ["--since", f"@{int(since)}"]
            rc, out, err = host.run(argv)
            if rc != 0:
                if boot == "0":
                    errors.append(f"journalctl -k -b 0: {err or rc}")
                else:
                    result["previous_boot"] = {"readable": False, "error": err or f"exit {rc}"}
                continue
            entries = parse_journal_json(out)
            result["scanned"] += len(entries)
            for e in entries:
                if kernel_interesting(journal_message(e)):
                    e["boot"] = int(boot)
                    result["entries"].append(e)
            if boot == "-1":
                result["previous_boot"] = {"readable": True, "error": None}
            else:
                result.update(readable=True, source="journal")
    else:
        errors.append("journalctl -k: " + (probe_err or "no kernel messages in the journal"))
    if not result["readable"]:
        boot_time = _boot_time()
        rc, out, err = host.run(["dmesg", "--time-format", "iso"])
        if rc != 0 and "time-format" in err:
            rc, out, err = host.run(["dmesg"])
        if rc != 0:
            errors.append(f"dmesg: {err or rc}")
        else:
            lines = out.splitlines()[-scan:]
            result["scanned"] += len(lines)
            for line in lines:
                e = parse_dmesg_line(line, boot_time)
                if e and kernel_interesting(e["MESSAGE"]):
                    ts = e.get("__REALTIME_TIMESTAMP")
                    if since is not None and ts is not None and int(ts) / 1e6 < since:
                        continue
                    e["boot"] = 0
                    result["entries"].append(e)
            result.update(readable=True, source="dmesg")
            result["previous_boot"] = {"readable": False, "error": "dmesg holds only the current boot"}
    if len(result["entries"]) > keep:
        result["entries"] = result["entries"][-keep:]
        result["truncated"] = True
    result["error"] = "; ".join(errors) or None
    if not result["readable"]:
        result["previous_boot"] = {"readable": False, "error": result["error"]}
    return result


def _boot_time():
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def gather_cgroup(unit, control_group):
    root = "/sys/fs/cgroup"
    path = control_group or unit_cgroup_default(unit)
    slice_path = path.rsplit("/", 1)[0]
    out = {"version": None, "readable": False, "error": None, "unit": None, "slice": None, "own": None}
    try:
        with open("/proc/1/cgroup") as f:
            out["own"] = f.read().strip().splitlines()
    except OSError:
        pass
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        out["version"] = 2
        names, base = ("memory.events",), root
    elif os.path.isdir(os.path.join(root, "memory")):
        out["version"] = 1
        names, base = ("memory.oom_control", "memory.failcnt", "memory.max_usage_in_bytes"), os.path.join(root, "memory")
    else:
        out["error"] = "no memory controller mounted at /sys/fs/cgroup"
        return out
    errors = []
    for key, cg in (("unit", path), ("slice", slice_path)):
        found = {"path": cg}
        if not os.path.isdir(base + cg):
            errors.append(f"{base + cg}: no such cgroup (unit not running, or not visible here)")
            continue
        for name in names:
            fpath = base + cg + "/" + name
            try:
                with open(fpath) as f:
                    text = f.read()
            except OSError as exc:
                errors.append(f"{fpath}: {exc.strerror}")
                continue
            if name in ("memory.failcnt", "memory.max_usage_in_bytes"):
                found[name] = int(text.strip() or 0)
            else:
                found[name] = parse_memory_events(text)
        if len(found) > 1:
            out[key] = found
            out["readable"] = True
    out["error"] = "; ".join(errors) or None
    return out


def gather_gpu(host):
    if not shutil.which("nvidia-smi"):
        return {"present": False}
    fields = ("index", "name", "pci.bus_id", "driver_version", "memory.used", "memory.total",
              "utilization.gpu", "temperature.gpu", "pstate")
    rc, out, err = host.run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    if rc != 0:
        return {"present": True, "readable": False, "error": (err or out).strip()[:500], "gpus": []}
    return {"present": True, "readable": True, "error": None, "csv": out, "gpus": parse_nvidia_smi_csv(out, fields)}


def gather_venv(host, venv, lock):
    """The venv's installed distributions against its lock. A lock that is missing or does not
    parse (locks.parse names the line) is recorded in `error`, never raised."""
    python = os.path.join(venv, "bin", "python")
    out = {"python": python, "lock": lock, "readable": False, "error": None, "drift": [], "missing": [],
           "unlocked": [], "checked": 0}
    try:
        with open(lock) as f:
            locked = locks.parse(f.read())
    except OSError as exc:
        out["error"] = f"{lock}: {exc.strerror or exc}"
        return out
    except ValueError as exc:  # also UnicodeDecodeError
        out["error"] = f"{lock}: not a lock: {exc}"
        return out
    if not os.path.exists(python):
        out["error"] = f"{python}: no such interpreter"
        return out
    rc, text, err = host.run([python, "-c", locks.LIST_INSTALLED_SCRIPT])
    if rc != 0:
        out["error"] = err or f"exit {rc}"
        return out
    try:
        installed = json.loads(text)
        if not isinstance(installed, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        out["error"] = f"unparsable package list: {exc}"
        return out
    drift, missing, unlocked = venv_drift(locked, installed)
    out.update(readable=True, drift=drift, missing=missing, unlocked=unlocked, checked=len(locked))
    return out


def run_window_start(unit_props, journal, status):
    candidates = []
    for entry in journal.get("entries") or []:
        try:
            candidates.append(int(entry["__REALTIME_TIMESTAMP"]) / 1e6)
            break
        except (KeyError, ValueError):
            continue
    value = (unit_props.get("properties") or {}).get("ExecMainStartTimestamp", "")
    if value.startswith("@"):
        try:
            candidates.append(float(value[1:]))
        except ValueError:
            pass
    started = (status.get("data") or {}).get("started") if isinstance(status.get("data"), dict) else None
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        candidates.append(float(started))
    elif isinstance(started, str):  # the trainer writes ISO 8601 UTC (2026-11-30T18:56:34Z)
        try:
            candidates.append(calendar.timegm(time.strptime(started.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z")))
        except ValueError:
            pass
    return min(candidates) - 60 if candidates else None


def _params(params):
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None})
    missing = [k for k in REQUIRED if not p.get(k)]
    if missing:
        raise EvidenceError(f"missing parameter(s): {', '.join(missing)}")
    if not layout.RUN_NAME_RE.match(str(p["run"])):
        raise EvidenceError(f"invalid run name {p['run']!r}")
    return p


def gather(params):
    """The evidence document for params (REQUIRED keys, others from DEFAULTS)."""
    t0 = time.time()
    p = _params(params)
    run, output_dir, venv, lock = p["run"], p["output_dir"], p["venv"], p["lock"]
    unit = p["unit"] or layout.unit_name(run)
    config = os.path.join(p["config_dir"], f"{run}.json")
    host = Host(float(p["command_timeout"]))
    errors = []

    ev = {"schema": SCHEMA, "run": run, "unit": unit, "host": socket.gethostname(), "collected_at": t0,
          "paths": {"output_dir": output_dir, "config": config, "venv": venv}}
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            ev["boot_id"] = f.read().strip().replace("-", "")
    except OSError:
        ev["boot_id"] = None
    ev["config"] = {"present": os.path.exists(config), "path": config, "mtime": _mtime(config)}
    ev["unit_props"] = gather_unit(host, unit)
    ev["journal"] = gather_journal(host, unit, int(p["journal_lines"]))
    ev["servers"] = gather_servers(host, run, int(p["journal_lines"]))
    ev["status"] = status_state(os.path.join(output_dir, layout.STATUS))
    since = run_window_start(ev["unit_props"], ev["journal"], ev["status"])
    ev["kernel"] = gather_kernel(host, since, int(p["kernel_scan_lines"]), int(p["kernel_keep_lines"]))
    ev["cgroup"] = gather_cgroup(unit, (ev["unit_props"]["properties"] or {}).get("ControlGroup"))
    ev["checkpoints"] = checkpoint_state(os.path.join(output_dir, layout.CHECKPOINTS), bool(p["checksum"]))
    ev["metrics"] = metrics_state(os.path.join(output_dir, layout.METRICS))
    ev["gpu"] = gather_gpu(host)
    ev["venv"] = gather_venv(host, venv, lock)
    ev["disk"] = disk_state(output_dir, p["shm"])
    ev["deaths"] = deaths_state(os.path.join(output_dir, layout.DEATHS))
    ev["errors"] = errors
    ev["elapsed_s"] = round(time.time() - t0, 3)
    return ev
