#!/usr/bin/python
"""Ansible module: gather the evidence of one flashfleet run on one host, as one JSON document."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time

DOCUMENTATION = r"""
module: flashfleet_evidence
short_description: Gather the evidence of why a flashfleet training run is (not) running
description:
  - Read-only. Collects the unit's systemd properties, the journal of its recent invocations,
    kernel log lines in the run's window (this boot and the previous one), cgroup memory events,
    status.json, checkpoint state, nvidia-smi CSV, the venv against its lock, and free disk.
  - Anything unreadable is recorded with the reason; nothing fails the task.
  - The returned C(evidence) is what diagnose.yml stores as evidence.json and what the classifier
    (files/flashfleet_classify.py) reads; it is also the test fixture format.
options:
  run: {description: Run name., type: str, required: true}
  unit: {description: "Unit name (default flashfleet-train@RUN.service).", type: str}
  output_dir: {description: "Run output dir (default /var/lib/flashfleet/runs/RUN).", type: str}
  config_dir: {description: Directory of rendered run configurations., type: str, default: /etc/flashfleet/runs}
  venv: {description: The run's virtual environment., type: str, default: /opt/flashfleet/venv}
  lock: {description: "Lock file (default VENV/flashfleet.lock).", type: str}
  journal_lines: {description: Most recent journal entries of the unit to keep., type: int, default: 2000}
  kernel_scan_lines: {description: Most recent kernel log entries to scan per boot., type: int, default: 20000}
  kernel_keep_lines: {description: Most kernel lines of interest to keep., type: int, default: 500}
  command_timeout: {description: Seconds allowed for each command., type: float, default: 5}
  checksum: {description: Verify checkpoint sha256 sums from the manifest (slow on large files)., type: bool, default: false}
  shm: {description: Shared-memory mount to report free space of., type: str, default: /dev/shm}
author: [flashfleet]
"""

EXAMPLES = r"""
- name: Gather evidence
  flashfleet_evidence:
    run: v2
  register: ev
"""

RETURN = r"""
evidence:
  description: The evidence document (schema 1); see docs/diagnosis.md.
  returned: always
  type: dict
"""

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # the parsing functions are importable without Ansible (tests, offline use)
    AnsibleModule = None

SCHEMA = 1

UNIT_PROPERTIES = (
    "Type", "Restart", "NotifyAccess", "WatchdogUSec", "RestartPreventExitStatus", "OOMPolicy",
    "MemoryMax", "MemoryHigh", "MemoryCurrent", "LoadState", "ActiveState", "SubState", "Result",
    "ExecMainCode", "ExecMainStatus", "ExecMainPID", "MainPID", "NRestarts", "InvocationID",
    "ExecMainStartTimestamp", "ExecMainExitTimestamp", "ActiveEnterTimestamp", "InactiveEnterTimestamp",
    "StateChangeTimestamp", "ControlGroup", "StatusText", "StatusErrno", "FragmentPath", "UnitFileState",
)

JOURNAL_FIELDS = (
    "MESSAGE", "MESSAGE_ID", "PRIORITY", "_PID", "_COMM", "_SYSTEMD_UNIT", "UNIT", "_SYSTEMD_INVOCATION_ID",
    "INVOCATION_ID", "EXIT_CODE", "EXIT_STATUS", "UNIT_RESULT", "SYSLOG_IDENTIFIER", "_TRANSPORT", "_BOOT_ID",
    "JOB_TYPE", "JOB_RESULT", "N_RESTARTS",
)

# Kernel lines worth keeping: OOM kills, NVIDIA Xid, crashes of processes, filesystem trouble.
KERNEL_INTEREST = re.compile(
    r"oom-kill|Out of memory|oom_reaper|invoked oom-killer|NVRM|Xid|segfault|general protection|"
    r"traps:|hung_task|blocked for more than|I/O error|EXT4-fs error|XFS .*error|No space left|"
    r"Memory cgroup|Killed process|nvidia|GPU has fallen|Machine check|mce:", re.IGNORECASE)

RE_DMESG_ISO = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](?P<frac>\d+))?(?P<tz>[+-]\d\d:?\d\d)?\s+(?P<msg>.*)$")
RE_DMESG_MONO = re.compile(r"^(?:<(?P<prio>\d+)>)?\[\s*(?P<mono>\d+\.\d+)\]\s?(?P<msg>.*)$")
MANIFEST_NAME = "manifest.json"


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
        seconds = _timegm(ts) - offset
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


def _timegm(st):
    import calendar
    return calendar.timegm(st)


def kernel_interesting(text):
    return bool(KERNEL_INTEREST.search(text))


def normalize_name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text):
    """pip lock lines `name==version` (comments, hashes, markers, extras allowed) as {name: version}."""
    pins = {}
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        line = line.split(";", 1)[0].split(" --hash", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*===?\s*([^\s,]+)$", line)
        if m:
            pins[normalize_name(m.group(1))] = m.group(2)
    return pins


def compare_versions(locked, installed):
    """Drift of installed ({name: version}) against the lock: (drift list, missing list)."""
    have = {normalize_name(k): v for k, v in installed.items()}
    drift, missing = [], []
    for name, version in sorted(locked.items()):
        if name not in have:
            missing.append(name)
        elif have[name].split("+")[0] != version.split("+")[0] and have[name] != version:
            drift.append({"name": name, "locked": version, "installed": have[name]})
    return drift, missing


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


def safetensors_check(path):
    """(ok, problem): the header parses (8-byte LE length + JSON) and the data size matches."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return False, "shorter than the 8-byte header length"
            (hlen,) = struct.unpack("<Q", raw)
            if hlen > min(size - 8, 100 * 2**20):
                return False, f"header length {hlen} exceeds the file"
            header = json.loads(f.read(hlen))
    except (OSError, ValueError) as exc:
        return False, f"header unreadable: {exc}"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return False, f"tensor {name} has no data_offsets"
    if 8 + hlen + end != size:
        return False, f"data size mismatch: header says {8 + hlen + end} bytes, file has {size}"
    return True, None


def _manifest_files(manifest):
    files = manifest.get("files", manifest)
    if isinstance(files, dict):
        return [(name, (info or {}).get("size", (info or {}).get("bytes")), (info or {}).get("sha256"))
                for name, info in files.items() if isinstance(info, dict)]
    out = []
    for item in files if isinstance(files, list) else []:
        if isinstance(item, dict):
            out.append((item.get("name") or item.get("path"), item.get("size", item.get("bytes")), item.get("sha256")))
    return out


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_state(ckpt_dir, checksum=False):
    state = {"dir": ckpt_dir, "readable": True, "error": None, "complete": [], "incomplete": [],
             "in_progress": [], "newest": None}
    try:
        names = sorted(os.listdir(ckpt_dir))
    except OSError as exc:
        state.update(readable=False, error=f"{ckpt_dir}: {exc.strerror}")
        return state
    for name in names:
        path = os.path.join(ckpt_dir, name)
        if name.startswith(".tmp-step-"):
            state["in_progress"].append({"name": name, "mtime": _mtime(path)})
            continue
        m = re.match(r"^step-(\d{8})$", name)
        if not m or not os.path.isdir(path):
            continue
        info = {"name": name, "step": int(m.group(1)), "mtime": _mtime(path), "bytes": 0, "ok": True, "problems": []}
        try:
            with open(os.path.join(path, MANIFEST_NAME)) as f:
                manifest = json.load(f)
            files = _manifest_files(manifest)
            if not files:
                info["problems"].append("manifest lists no files")
        except (OSError, ValueError) as exc:
            info["problems"].append(f"no valid {MANIFEST_NAME}: {exc}")
            files = []
        for fname, size, digest in files:
            fpath = os.path.join(path, str(fname))
            try:
                actual = os.path.getsize(fpath)
            except OSError as exc:
                info["problems"].append(f"{fname}: {exc.strerror}")
                continue
            info["bytes"] += actual
            if size is not None and int(size) != actual:
                info["problems"].append(f"{fname}: {actual} bytes, manifest says {size}")
            elif checksum and digest and _sha256(fpath) != digest:
                info["problems"].append(f"{fname}: sha256 differs from the manifest")
        weights = os.path.join(path, "drafter.safetensors")
        if os.path.exists(weights):
            ok, problem = safetensors_check(weights)
            info["safetensors_ok"] = ok
            if not ok:
                info["problems"].append(f"drafter.safetensors: {problem}")
        info["ok"] = not info["problems"]
        state["complete" if info["ok"] else "incomplete"].append(info)
    if state["complete"]:
        state["newest"] = max(state["complete"], key=lambda c: c["step"])
    return state


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def last_jsonl_record(path, tail_bytes=65536):
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - tail_bytes))
        lines = f.read().splitlines()
    for raw in reversed(lines):
        try:
            return json.loads(raw), size
        except ValueError:
            continue
    return None, size


def read_json_file(path):
    try:
        with open(path) as f:
            return {"readable": True, "error": None, "path": path, "data": json.load(f)}
    except (OSError, ValueError) as exc:
        return {"readable": False, "error": f"{path}: {getattr(exc, 'strerror', None) or exc}", "path": path, "data": None}


def free_space(path):
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return {"path": path, "measured_at": probe, "free_bytes": st.f_bavail * st.f_frsize,
            "total_bytes": st.f_blocks * st.f_frsize}


def disk_state(output_dir, shm):
    """Free space of the run dir, of where its checkpoints really are (a symlink or a mount can put
    them on another filesystem, which is the one that fills during a save), and of /dev/shm."""
    disk = {"output_dir": free_space(output_dir), "shm": free_space(shm)}
    ckpt = os.path.join(output_dir, "checkpoints")
    real = os.path.realpath(ckpt)
    try:
        other_fs = os.path.exists(ckpt) and os.stat(real).st_dev != os.stat(output_dir).st_dev
    except OSError:
        other_fs = False
    if other_fs:
        disk["checkpoints"] = dict(free_space(real), path=ckpt, realpath=real)
    return disk


def unit_cgroup_default(unit):
    prefix, _, _ = unit.partition("@")
    if "@" in unit:
        escaped = prefix.replace("-", "\\x2d")
        return f"/system.slice/system-{escaped}.slice/{unit}"
    return f"/system.slice/{unit}"


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
        files, base = ("memory.events",), root
    elif os.path.isdir(os.path.join(root, "memory")):
        out["version"] = 1
        files, base = ("memory.oom_control", "memory.failcnt", "memory.max_usage_in_bytes"), os.path.join(root, "memory")
    else:
        out["error"] = "no memory controller mounted at /sys/fs/cgroup"
        return out
    errors = []
    for key, cg in (("unit", path), ("slice", slice_path)):
        found = {"path": cg}
        if not os.path.isdir(base + cg):
            errors.append(f"{base + cg}: no such cgroup (unit not running, or not visible here)")
            continue
        for name in files:
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


INSTALLED_SNIPPET = ("import importlib.metadata as m, json; "
                     "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}))")


def gather_venv(host, venv, lock):
    python = os.path.join(venv, "bin", "python")
    out = {"python": python, "lock": lock, "readable": False, "error": None, "drift": [], "missing": [], "checked": 0}
    try:
        with open(lock) as f:
            locked = parse_lock(f.read())
    except OSError as exc:
        out["error"] = f"{lock}: {exc.strerror}"
        return out
    if not os.path.exists(python):
        out["error"] = f"{python}: no such interpreter"
        return out
    rc, text, err = host.run([python, "-c", INSTALLED_SNIPPET])
    if rc != 0:
        out["error"] = err or f"exit {rc}"
        return out
    try:
        installed = json.loads(text)
    except ValueError as exc:
        out["error"] = f"unparsable package list: {exc}"
        return out
    drift, missing = compare_versions(locked, installed)
    out.update(readable=True, drift=drift, missing=missing, checked=len(locked))
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
            candidates.append(_timegm(time.strptime(started.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z")))
        except ValueError:
            pass
    return min(candidates) - 60 if candidates else None


def gather(params):
    t0 = time.time()
    run = params["run"]
    unit = params.get("unit") or f"flashfleet-train@{run}.service"
    output_dir = params.get("output_dir") or f"/var/lib/flashfleet/runs/{run}"
    venv = params.get("venv") or "/opt/flashfleet/venv"
    lock = params.get("lock") or os.path.join(venv, "flashfleet.lock")
    config = os.path.join(params.get("config_dir") or "/etc/flashfleet/runs", f"{run}.json")
    host = Host(float(params.get("command_timeout") or 5))
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
    ev["journal"] = gather_journal(host, unit, int(params.get("journal_lines") or 2000))
    ev["status"] = read_json_file(os.path.join(output_dir, "status.json"))
    since = run_window_start(ev["unit_props"], ev["journal"], ev["status"])
    ev["kernel"] = gather_kernel(host, since, int(params.get("kernel_scan_lines") or 20000),
                                 int(params.get("kernel_keep_lines") or 500))
    ev["cgroup"] = gather_cgroup(unit, (ev["unit_props"]["properties"] or {}).get("ControlGroup"))
    ev["checkpoints"] = checkpoint_state(os.path.join(output_dir, "checkpoints"), bool(params.get("checksum")))
    metrics_path = os.path.join(output_dir, "metrics.jsonl")
    try:
        last, size = last_jsonl_record(metrics_path)
        ev["metrics"] = {"readable": True, "error": None, "path": metrics_path, "last": last, "bytes": size,
                         "mtime": _mtime(metrics_path)}
    except OSError as exc:
        ev["metrics"] = {"readable": False, "error": f"{metrics_path}: {exc.strerror}", "path": metrics_path, "last": None}
    ev["gpu"] = gather_gpu(host)
    ev["venv"] = gather_venv(host, venv, lock)
    ev["disk"] = disk_state(output_dir, params.get("shm") or "/dev/shm")
    ev["errors"] = errors
    ev["elapsed_s"] = round(time.time() - t0, 3)
    return ev


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run=dict(type="str", required=True),
            unit=dict(type="str"),
            output_dir=dict(type="str"),
            config_dir=dict(type="str", default="/etc/flashfleet/runs"),
            venv=dict(type="str", default="/opt/flashfleet/venv"),
            lock=dict(type="str"),
            journal_lines=dict(type="int", default=2000),
            kernel_scan_lines=dict(type="int", default=20000),
            kernel_keep_lines=dict(type="int", default=500),
            command_timeout=dict(type="float", default=5),
            checksum=dict(type="bool", default=False),
            shm=dict(type="str", default="/dev/shm"),
        ),
        supports_check_mode=True,
    )
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", module.params["run"]):
        module.fail_json(msg=f"invalid run name {module.params['run']!r}")
    module.exit_json(changed=False, evidence=gather(module.params))


if __name__ == "__main__":
    main()
