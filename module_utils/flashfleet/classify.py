"""Turn one host's evidence (the JSON the flashfleet_evidence module gathers, flashfleet.evidence)
into a verdict.

Standard library only, no Ansible import: the role's filter plugin imports it on the controller
(`from flashfleet import classify`), and a user runs it offline on evidence that diagnose.yml or
collect.yml brought home:

    flashfleet-classify runs/v2/gpu01/evidence.json
    flashfleet-classify runs/v2                        # every host
    flashfleet-classify --json runs/v2/gpu01/evidence.json

(`python -m flashfleet.classify ...` is the same without the console script.)

Rules (see docs/diagnosis.md): one verdict per host, the most specific one the evidence proves,
with the lines that prove it and a next step.
- A hardware Xid in the invocation's window outranks the crash it caused.
- A kernel OOM line naming the run's cgroup or one of its pids outranks a bare SIGKILL.
- A death before READY is `init-crash`, whatever its cause; the cause is named in `cause`.
- SIGKILL with an unreadable kernel log is `killed-by-signal`, "kernel log unreadable, OOM not
  ruled out".
- When nothing proves a cause: `unknown`, with the evidence.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from .contract import layout, messages

SCHEMA = 1

VERDICTS = (
    "running", "completed", "not-started", "init-crash", "crash", "host-oom-kill",
    "cgroup-oom-kill", "cuda-oom", "gpu-xid-<n>", "nccl-timeout", "watchdog-hang", "disk-full",
    "killed-by-signal", "peer-failure", "stopped", "unknown",
)

# NVIDIA Xid catalog: usually the application's own fault, and hardware/driver faults.
XID_APPLICATION = {13, 31, 43, 45}
XID_HARDWARE = {48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 154}

# Signals a process sends itself when it crashes; anything else came from outside.
CRASH_SIGNALS = {4, 5, 6, 7, 8, 11, 31}
SIGNAL_NAMES = {1: "HUP", 2: "INT", 3: "QUIT", 4: "ILL", 5: "TRAP", 6: "ABRT", 7: "BUS", 8: "FPE",
                9: "KILL", 11: "SEGV", 13: "PIPE", 14: "ALRM", 15: "TERM", 31: "SYS"}
SIGNAL_NUMBERS = {name: num for num, name in SIGNAL_NAMES.items()}

KERNEL_AFTER_EXIT_S = 30.0
KERNEL_BEFORE_START_S = 5.0
OOM_TIME_TIE_S = 10.0

# systemd catalog message ids (systemd 252, src/systemd/sd-messages.h)
MID_STARTED = "39f53479d3a045ac8e11786248231fbf"
MID_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
MID_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
MID_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
MID_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"

RE_OOM_KILL = re.compile(
    r"oom-kill:constraint=(?P<constraint>\w+),.*?(?:oom_memcg=(?P<oom_memcg>[^,]*),)?"
    r"task_memcg=(?P<task_memcg>[^,]*),task=(?P<task>[^,]*),pid=(?P<pid>\d+)")
RE_OOM_KILLED = re.compile(
    r"(?P<kind>Memory cgroup out of memory|Out of memory): Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)")
RE_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[^)]*)\): (?P<code>\d+)(?P<rest>.*)")
RE_XID_PID = re.compile(r"pid=(?P<pid>\d+|'<unknown>'|<unknown>)")
RE_XID_NAME = re.compile(r"name=(?P<name>[^,]*)")
RE_MAIN_EXIT = re.compile(r"Main process exited, code=(?P<code>\w+), status=(?P<status>\d+)(?:/(?P<name>\w+))?")
RE_RESULT = re.compile(r"Failed with result '(?P<result>[\w-]+)'")
RE_EXCEPTION = re.compile(
    r"^(?P<name>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning))(?::\s?(?P<text>.*))?$")
RE_TORCH_SHORT_WRITE = re.compile(r"inline_container\.cc.*unexpected pos|PytorchStreamWriter failed writing|file write failed")
NEARLY_FULL_BYTES = 64 * 2**20
NEARLY_FULL_FRACTION = 0.01

# Signatures of diagnosis.md that name a cause inside a traceback, with the next step.
HINTS = (
    (re.compile(r"Failed to find C compiler"), "Triton found no C compiler: install gcc (build_toolchain role) and re-run provision"),
    (re.compile(r"Python\.h: No such file or directory"), "Triton cannot build its launcher: install the Python headers for the venv's interpreter (python3-dev)"),
    (re.compile(r"ptxas fatal\s*: Value '[^']+' is not defined for option 'gpu-name'"), "ptxas does not know this GPU: the CUDA toolkit is too old for the architecture"),
    (re.compile(r"CUDA driver version is insufficient for CUDA runtime version"), "the NVIDIA driver is older than the CUDA runtime: upgrade the driver or pin an older torch"),
    (re.compile(r"provided PTX was compiled with an unsupported toolchain"), "PTX from a newer toolkit than the driver supports: upgrade the driver"),
    (re.compile(r"no kernel image is available for execution on the device"), "the installed torch/kernels were not built for this GPU architecture"),
    (re.compile(r"is not compatible with the current PyTorch installation"), "this torch build does not support the GPU architecture: install a torch built for it"),
    (re.compile(r"Driver/library version mismatch"), "the loaded NVIDIA kernel module and user-space libraries differ: reboot or reload the driver"),
    (re.compile(r"validation error for Settings|Extra inputs are not permitted"), "wandb rejected its settings: the wandb/pydantic versions drifted from the lock; re-sync the venv (provision) "),
    (re.compile(r"ModuleNotFoundError|ImportError: cannot import name"), "a package is missing or drifted: re-sync the venv from the lock (provision) and compare `venv` drift in evidence.json"),
    (re.compile(r"illegal memory access|device-side assert triggered"), "a kernel faulted on the GPU (application bug): re-run with CUDA_LAUNCH_BLOCKING=1 to find the op"),
    (RE_TORCH_SHORT_WRITE, "a checkpoint write came up short: check free space and the health of the output filesystem"),
    (re.compile(r"No space left on device|\[Errno 28\]"), "free space on the output filesystem (or lower keep-last checkpoints), then restart; the unit resumes from the newest complete checkpoint"),
)

NEXT_STEPS = {
    "running": "nothing to do; `collect.yml -e run=RUN` brings metrics home",
    "completed": "collect the run: `ansible-playbook collect.yml -e run=RUN`",
    "not-started": "launch it: `ansible-playbook train.yml -e run=RUN`",
    "stopped": "stopped through systemd; start again with train.yml to resume from the newest checkpoint",
    "host-oom-kill": "the machine ran out of RAM: lower host memory use (fewer target replicas per host, smaller prefetch, model in /dev/shm counts as RAM) or add memory",
    "cgroup-oom-kill": "the run exceeded its memory limit: raise MemoryMax for the run (or the container's limit), or lower batch/prefetch",
    "cuda-oom": "GPU memory exhausted: lower --token-budget / --max-batch-size / --max-seq-len, or move the drafter to a GPU with more free memory",
    "nccl-timeout": "a collective timed out: look for a rank that died or hung first (diagnose every host), check the network/NVLink, then restart",
    "watchdog-hang": "the trainer stopped sending WATCHDOG=1: look at the last journal lines for where it hung (data loading, a collective); restart resumes from the newest checkpoint",
    "disk-full": "free space on the output filesystem, then restart; the unit resumes from the newest complete checkpoint",
    "killed-by-signal": "something outside the run killed it: check who (operators, other automation, the OOM killer if the kernel log was unreadable); restart with train.yml",
    "crash": "fix the exception shown; the unit restarts on failure and resumes from the newest complete checkpoint",
    "peer-failure": "another node of the run failed first (named in the reason): diagnose that host; this one restarts with the run and resumes from the newest checkpoint",
    "init-crash": "fix the cause shown and launch again with train.yml",
    "unknown": "read evidence.json (journal, unit properties, kernel log) by hand",
    "gpu-xid": "hardware/driver fault: drain this GPU (exclude it from the run), reset it (nvidia-smi -r) or reboot; RMA if it repeats",
}


# ---------------------------------------------------------------------------------------------
# small readers


def message(entry: dict) -> str:
    """MESSAGE of a journal JSON entry: a string, a byte array (not valid UTF-8) or a list of values."""
    value = entry.get("MESSAGE")
    if value is None:
        return ""
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", errors="replace")
        return "\n".join(message({"MESSAGE": v}) for v in value)
    return str(value)


def field(entry: dict, name: str) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return bytes(value).decode("utf-8", errors="replace")
        return str(value[-1]) if value else None
    return str(value)


def realtime(entry: dict) -> float | None:
    value = field(entry, "__REALTIME_TIMESTAMP")
    try:
        return int(value) / 1e6 if value is not None else None
    except ValueError:
        return None


def parse_systemd_time(value: str | None) -> float | None:
    """A systemctl show timestamp: `Thu 2023-11-30 18:10:01.123456 UTC` (--timestamp=us+utc), `@1701367801`
    (--timestamp=unix) or `Thu 2023-11-30 18:10:01 UTC`."""
    if not value or value in ("n/a", "0"):
        return None
    value = value.strip()
    if value.startswith("@"):
        try:
            return float(value[1:])
        except ValueError:
            return None
    for fmt in ("%a %Y-%m-%d %H:%M:%S %Z", "%a %Y-%m-%d %H:%M:%S.%f %Z"):
        try:
            parsed = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return parsed.replace(tzinfo=UTC).timestamp()
    return None


def status_time(value) -> float | None:
    """A time from status.json: unix seconds (number or numeric string) or ISO 8601 (`...Z`)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    number = as_float(text)
    if number is not None:
        return number
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def as_float(value, default=None):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def as_int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------------
# the journal, cut into invocations


class Invocation:
    def __init__(self, ident: str | None):
        self.id = ident
        self.entries: list[dict] = []
        self.exit_code: str | None = None     # exited | killed | dumped
        self.exit_status: int | None = None
        self.result: str | None = None        # success | exit-code | signal | core-dump | oom-kill | watchdog | timeout ...
        self.exit_ts: float | None = None
        self.exit_line: str | None = None
        self.result_line: str | None = None
        self.started = False                  # "Started <unit>": READY=1 for Type=notify
        self.started_line: str | None = None
        self.start_failed = False
        self.stopping = False
        self.stopping_line: str | None = None
        self.watchdog_line: str | None = None
        self.oom_line: str | None = None

    @property
    def first_ts(self) -> float | None:
        for e in self.entries:
            ts = realtime(e)
            if ts is not None:
                return ts
        return None

    @property
    def last_ts(self) -> float | None:
        for e in reversed(self.entries):
            ts = realtime(e)
            if ts is not None:
                return ts
        return None

    def app_lines(self) -> list[tuple[float | None, str]]:
        """The trainer's own output (everything not from PID 1 about the unit)."""
        out = []
        for e in self.entries:
            if is_manager_entry(e):
                continue
            for line in message(e).splitlines() or [""]:
                out.append((realtime(e), line))
        return out


def is_manager_entry(entry: dict) -> bool:
    return field(entry, "_PID") == "1" or (entry.get("UNIT") is not None and entry.get("_SYSTEMD_UNIT") in (None, "init.scope"))


def split_invocations(entries: list[dict]) -> list[Invocation]:
    invocations: list[Invocation] = []
    by_id: dict[str, Invocation] = {}
    current: Invocation | None = None
    for entry in entries:
        ident = field(entry, "_SYSTEMD_INVOCATION_ID") or field(entry, "INVOCATION_ID")
        if ident:
            if ident not in by_id:
                by_id[ident] = Invocation(ident)
                invocations.append(by_id[ident])
            inv = by_id[ident]
            current = inv
        else:
            if current is None:
                current = Invocation(None)
                invocations.append(current)
            inv = current
        inv.entries.append(entry)
        if is_manager_entry(entry):
            _manager_event(inv, entry)
    return invocations


def _manager_event(inv: Invocation, entry: dict) -> None:
    text = message(entry)
    mid = field(entry, "MESSAGE_ID")
    code = field(entry, "EXIT_CODE")
    m = RE_MAIN_EXIT.search(text)
    if code or m:
        inv.exit_code = code or m.group("code")
        status = field(entry, "EXIT_STATUS") or (m.group("status") if m else None)
        if status is not None and not status.isdigit():
            status = str(SIGNAL_NUMBERS.get(status.upper().removeprefix("SIG"), status))
        inv.exit_status = as_int(status)
        inv.exit_ts = realtime(entry)
        inv.exit_line = text
    result = field(entry, "UNIT_RESULT")
    m = RE_RESULT.search(text)
    if result or m:
        inv.result = result or m.group("result")
        inv.result_line = text
        inv.exit_ts = inv.exit_ts or realtime(entry)
    if mid == MID_STARTED or text.startswith("Started "):
        inv.started = True
        inv.started_line = text
    if mid == MID_FAILED or text.startswith("Failed to start "):
        inv.start_failed = True
    if mid == MID_STOPPING or text.startswith("Stopping "):
        inv.stopping = True
        inv.stopping_line = text
    if text.startswith("Watchdog timeout"):
        inv.watchdog_line = text
    if "killed by the OOM killer" in text:
        inv.oom_line = text


# ---------------------------------------------------------------------------------------------
# the kernel log


def kernel_events(evidence: dict, start: float | None, end: float | None) -> tuple[list[dict], list[dict]]:
    """OOM kills and Xid lines of the kernel log inside [start, end] (bounds widened a little)."""
    kernel = evidence.get("kernel") or {}
    lo = start - KERNEL_BEFORE_START_S if start is not None else None
    hi = end + KERNEL_AFTER_EXIT_S if end is not None else None
    ooms: dict[str, dict] = {}
    xids: list[dict] = []
    for entry in kernel.get("entries") or []:
        ts = realtime(entry)
        if ts is not None and ((lo is not None and ts < lo) or (hi is not None and ts > hi)):
            continue
        text = message(entry)
        m = RE_OOM_KILL.search(text)
        if m:
            oom = ooms.setdefault(m.group("pid"), {"pid": m.group("pid"), "lines": []})
            oom.update(constraint=m.group("constraint"), task_memcg=m.group("task_memcg"),
                       oom_memcg=m.group("oom_memcg"), comm=m.group("task"), ts=ts)
            oom["lines"].append(kline(ts, text))
            continue
        m = RE_OOM_KILLED.search(text)
        if m:
            oom = ooms.setdefault(m.group("pid"), {"pid": m.group("pid"), "lines": []})
            oom.setdefault("ts", ts)
            oom.setdefault("comm", m.group("comm"))
            oom["memcg_kill"] = m.group("kind").startswith("Memory cgroup")
            oom["lines"].append(kline(ts, text))
            continue
        m = RE_XID.search(text)
        if m:
            rest = m.group("rest")
            pid = RE_XID_PID.search(rest)
            name = RE_XID_NAME.search(rest)
            code = int(m.group("code"))
            xids.append({"code": code, "pci": m.group("pci"), "ts": ts,
                         "pid": pid.group("pid") if pid and pid.group("pid").isdigit() else None,
                         "name": name.group("name").strip() if name else None,
                         "hardware": code in XID_HARDWARE, "application": code in XID_APPLICATION,
                         "line": kline(ts, text)})
    return list(ooms.values()), xids


def kline(ts: float | None, text: str) -> str:
    return f"kernel {fmt_time(ts)}: {text.strip()}"


def jline(ts: float | None, text: str) -> str:
    return f"journal {fmt_time(ts)}: {text.strip()}"


def host_memcg(evidence: dict) -> str | None:
    """The memory cgroup this host (a container, say) lives in, from PID 1's /proc/1/cgroup; None
    when that is the root (a real host) or unknown: then nothing can be excluded by it."""
    own = (evidence.get("cgroup") or {}).get("own") or []
    path = None
    for line in own:
        parts = str(line).split(":", 2)
        if len(parts) == 3 and ("memory" in parts[1].split(",") or (parts[0] == "0" and parts[1] == "" and path is None)):
            path = parts[2]
            if "memory" in parts[1].split(","):
                break
    if path is None:
        return None
    path = path.removesuffix("/init.scope").rstrip("/")
    return path or None


def memcg_in_host(memcg: str | None, host_cg: str | None) -> bool:
    """False when the kernel line's cgroup is provably another container's (a shared kernel)."""
    if not memcg or not host_cg:
        return True
    return memcg == host_cg or memcg.startswith(host_cg + "/")


def memcg_names_other_unit(memcg: str | None, unit_names: set[str]) -> bool:
    if not memcg:
        return False
    leaf = memcg.rstrip("/").rsplit("/", 1)[-1]
    return leaf.endswith((".service", ".scope")) and not any(u in memcg for u in unit_names)


# ---------------------------------------------------------------------------------------------
# the verdict


class Finding:
    """A candidate verdict with its proof."""

    def __init__(self, verdict: str, reason: str, lines: list[str], next_step: str | None = None, **extra):
        self.verdict = verdict
        self.reason = " / ".join(part.strip() for part in reason.splitlines() if part.strip())
        self.lines = lines
        self.next_step = next_step or NEXT_STEPS.get(verdict.split("-")[0] + "-xid" if verdict.startswith("gpu-xid-") else verdict)
        self.extra = extra

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "evidence": self.lines,
                "next_step": self.next_step, **self.extra}


def classify(evidence: dict) -> dict:
    """The diagnosis of one host: verdict, one-line reason, proving lines, next step, and facts."""
    run = evidence.get("run") or "?"
    unit = evidence.get("unit") or layout.unit_name(run)
    props = ((evidence.get("unit_props") or {}).get("properties")) or {}
    journal = evidence.get("journal") or {}
    status = ((evidence.get("status") or {}).get("data")) or {}
    kernel = evidence.get("kernel") or {}
    ckpt = evidence.get("checkpoints") or {}
    newest = (ckpt.get("newest") or {}).get("name")
    step = as_int(status.get("step"))
    if step is None:
        step = as_int(((evidence.get("metrics") or {}).get("last") or {}).get("step"))

    invocations = split_invocations(journal.get("entries") or [])
    warnings = []
    if not journal.get("readable", True):
        warnings.append(f"journal unreadable: {journal.get('error')}")
    if not kernel.get("readable", True):
        warnings.append(f"kernel log unreadable: {kernel.get('error')}")
    for d in (evidence.get("venv") or {}).get("drift") or []:
        warnings.append(f"venv drift: {d.get('name')} installed {d.get('installed')} but locked {d.get('locked')}")

    finding = _decide(evidence, run, unit, props, status, invocations, warnings)
    out = {
        "schema": SCHEMA,
        "run": run,
        "host": evidence.get("host"),
        "unit": unit,
        **finding.as_dict(),
        "step": step,
        "newest_checkpoint": newest,
        "nrestarts": as_int(props.get("NRestarts"), 0),
        # When the unit's main process last ended (epoch seconds), for ordering failures across hosts.
        "ended_at": parse_systemd_time(props.get("ExecMainExitTimestamp")),
        "warnings": warnings,
        "classified_at": time.time(),
    }
    if out.get("next_step"):
        out["next_step"] = out["next_step"].replace("RUN", run)
    return out


def _decide(evidence, run, unit, props, status, invocations, warnings) -> Finding:
    active = props.get("ActiveState", "")
    sub = props.get("SubState", "")
    load = props.get("LoadState", "")
    unit_props = evidence.get("unit_props") or {}
    journal_readable = (evidence.get("journal") or {}).get("readable", True)
    props_line = "systemctl: " + " ".join(
        f"{k}={props[k]}" for k in ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode",
                                    "ExecMainStatus", "NRestarts") if k in props)

    ever_ran = bool(invocations) or bool(status) or parse_systemd_time(props.get("ExecMainStartTimestamp")) is not None
    if not ever_ran:
        if not unit_props.get("readable", True):
            return Finding("unknown", f"unit state unreadable ({unit_props.get('error')}) and no journal or status.json",
                           [f"systemctl: {unit_props.get('error')}"])
        if load == "not-found":
            reason = f"{unit} is not installed (template unit missing) and nothing of the run exists"
        elif not (evidence.get("config") or {}).get("present", True):
            reason = f"no run configuration at {(evidence.get('config') or {}).get('path')}, no journal, no status.json"
        else:
            reason = "the unit has never started on this host: no invocation in the journal, no status.json"
        if not journal_readable:
            return Finding("unknown", "journal unreadable and no status.json: cannot tell whether it ever started",
                           [props_line])
        return Finding("not-started", reason, [props_line])

    if active in ("active", "reloading") or (active == "activating" and sub != "auto-restart"):
        return _running(evidence, run, unit, props, status, invocations, props_line, warnings)

    # The unit is down (inactive, failed, or waiting to restart): explain its last death.
    target = _last_exit_invocation(invocations, props)
    return _explain_death(evidence, run, unit, props, status, target, props_line, warnings, current=True)


def _running(evidence, run, unit, props, status, invocations, props_line, warnings) -> Finding:
    active = props.get("ActiveState")
    lines = [props_line]
    metrics_last = (evidence.get("metrics") or {}).get("last") or {}
    step = status.get("step", metrics_last.get("step"))
    if active == "activating":
        text = props.get("StatusText") or status.get("phase") or "loading"
        reason = f"starting, not READY yet ({text})"
    else:
        reason = f"training, step {step}" if step is not None else "active"
        updated = status_time(status.get("updated"))
        if updated is not None:
            age = (evidence.get("collected_at") or time.time()) - updated
            reason += f", status updated {age:.0f} s ago"
            lines.append(f"status.json: phase={status.get('phase')} step={step} updated {fmt_time(updated)}")
    nrestarts = as_int(props.get("NRestarts"), 0)
    previous = None
    if nrestarts or len(invocations) > 1:
        current_id = props.get("InvocationID")
        earlier = [i for i in invocations if i.id != current_id and (i.exit_code or i.result)]
        if earlier:
            prev = _explain_death(evidence, run, unit, {}, {}, earlier[-1], "", [], current=False)
            previous = {"verdict": prev.verdict, "reason": prev.reason, "evidence": prev.lines,
                        "ended_at": earlier[-1].exit_ts}
            if nrestarts:
                reason += f"; restarted {nrestarts}x, last death: {prev.verdict} ({prev.reason})"
            else:  # started again by hand (train.yml), not by Restart=
                reason += f"; an earlier invocation ended: {prev.verdict} ({prev.reason})"
    # A hardware Xid while running is worth saying even if the run survived it.
    start = parse_systemd_time(props.get("ExecMainStartTimestamp"))
    _, xids = kernel_events(evidence, start, None)
    for x in xids:
        if x["hardware"]:
            warnings.append(f"hardware Xid {x['code']} on {x['pci']} while running: {x['line']}")
    return Finding("running", reason, lines, previous=previous)


def _last_exit_invocation(invocations: list[Invocation], props: dict) -> Invocation:
    ident = props.get("InvocationID") or None
    for inv in invocations:
        if ident and inv.id == ident:
            return inv
    with_exit = [i for i in invocations if i.exit_code or i.result]
    if with_exit:
        return with_exit[-1]
    return invocations[-1] if invocations else Invocation(ident)


def _exit_facts(props: dict, inv: Invocation, current: bool) -> dict:
    """Result / exit code / status of the invocation: systemctl's record, else the journal's."""
    facts = {"result": inv.result, "code": inv.exit_code, "status": inv.exit_status, "ts": inv.exit_ts,
             "source": "journal"}
    if current and props:
        main_code = as_int(props.get("ExecMainCode"), 0)
        exit_ts = parse_systemd_time(props.get("ExecMainExitTimestamp"))
        if main_code or exit_ts is not None:
            facts.update(code={1: "exited", 2: "killed", 3: "dumped"}.get(main_code, facts["code"]),
                         status=as_int(props.get("ExecMainStatus"), facts["status"]),
                         ts=exit_ts or facts["ts"], source="systemctl")
        if props.get("Result") and (props["Result"] != "success" or facts["result"] is None):
            facts["result"] = props["Result"]
    return facts


def _run_pids(props: dict, status: dict, inv: Invocation) -> set[str]:
    pids = set()
    for value in (props.get("ExecMainPID"), props.get("MainPID"), status.get("pid")):
        if as_int(value):
            pids.add(str(as_int(value)))
    for e in inv.entries:
        if not is_manager_entry(e) and field(e, "_PID"):
            pids.add(field(e, "_PID"))
    return pids


def _explain_death(evidence, run, unit, props, status, inv, props_line, warnings, current) -> Finding:
    facts = _exit_facts(props, inv, current)
    kernel = evidence.get("kernel") or {}
    kernel_readable = kernel.get("readable", True)
    start = inv.first_ts or (parse_systemd_time(props.get("ExecMainStartTimestamp")) if current else None)
    end = facts["ts"] or inv.last_ts
    ooms, xids = kernel_events(evidence, start, end)
    app = inv.app_lines()
    base = [line for line in (props_line,) if line]
    if inv.exit_line:
        base.append(jline(inv.exit_ts, inv.exit_line))
    if inv.result_line:
        base.append(jline(inv.exit_ts, inv.result_line))

    ready = inv.started
    if not ready and not inv.start_failed and current and status:
        # Journal may have been cut (journal line cap) or unreadable: fall back to the trainer's status.
        first_seen = inv.first_ts
        if status.get("ready") and (first_seen is None or not journal_is_complete(evidence)):
            ready = True
    if inv.started_line:
        base.append(f"journal: {inv.started_line} (READY=1 received)")

    # Clean endings first: a stop through systemd, a finished run.
    phase = status.get("phase") if current else None
    if facts["result"] == "success" or (facts["code"] == "exited" and facts["status"] == 0):
        if inv.stopping or phase == "stopped":
            proof = base + ([jline(None, inv.stopping_line)] if inv.stopping_line else []) + (
                [f"status.json: phase={phase}"] if phase else [])
            return Finding("stopped", "stopped through systemd (clean exit)", proof)
        if phase == "completed":
            return Finding("completed", f"finished: exit 0, status.json phase=completed at step {status.get('step')}",
                           base + [f"status.json: phase=completed step={status.get('step')}"])
        if facts["code"] == "exited" and facts["status"] == 0:
            return Finding("unknown", "exit 0 but status.json says neither completed nor stopped",
                           base + [f"status.json: phase={phase}"])

    cause = _cause(evidence, run, unit, props, status, inv, facts, ooms, xids, app, kernel_readable, base, current)
    if cause.verdict in ("stopped", "completed"):
        return cause
    if not ready:
        when = f"{(end - start):.0f} s after start" if (start is not None and end is not None) else "during start-up"
        reason = f"died before READY ({when}): {cause.reason}"
        if inv.start_failed and facts["result"] == "timeout":
            reason = f"start timed out before READY (TimeoutStartSec): {cause.reason}"
        return Finding("init-crash", reason, cause.lines, cause.next_step,
                       cause={"verdict": cause.verdict, "reason": cause.reason, **cause.extra})
    return cause


def journal_is_complete(evidence: dict) -> bool:
    journal = evidence.get("journal") or {}
    return journal.get("readable", True) and not journal.get("truncated")


def _describe_exit(facts: dict) -> str:
    code, status = facts.get("code"), facts.get("status")
    if code in ("killed", "dumped") and status is not None:
        return f"signal {status}/{SIGNAL_NAMES.get(status, '?')}" + (" (core dumped)" if code == "dumped" else "")
    if code == "exited":
        return f"exit status {status}"
    return f"result {facts.get('result') or 'unknown'}"


def _last_exception(app: list[tuple[float | None, str]]) -> tuple[str | None, list[str]]:
    """The final exception line of the last traceback (or the last exception-looking line)."""
    last_tb = None
    for i, (_, line) in enumerate(app):
        if "Traceback (most recent call last)" in line:
            last_tb = i
    candidates = app[last_tb:] if last_tb is not None else app
    found = None
    for ts, line in candidates:
        stripped = line.strip()
        m = RE_EXCEPTION.match(stripped)
        if m and (last_tb is not None or m.group("text") is not None):
            found = (ts, stripped)
    if not found:
        return None, []
    lines = []
    if last_tb is not None:
        lines.append(jline(app[last_tb][0], app[last_tb][1]))
    lines.append(jline(found[0], found[1]))
    return found[1], lines


def _grep(app, pattern: re.Pattern | str) -> tuple[float | None, str] | None:
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    hit = None
    for ts, line in app:
        if rx.search(line):
            hit = (ts, line)
    return hit


def _hint(text: str) -> str | None:
    for rx, hint in HINTS:
        if rx.search(text):
            return hint
    return None


def _cause(evidence, run, unit, props, status, inv, facts, ooms, xids, app, kernel_readable, base, current) -> Finding:
    code, sig = facts["code"], facts["status"]
    killed = code in ("killed", "dumped")
    exit_desc = _describe_exit(facts)
    unit_names = {unit, unit.replace("-", "\\x2d")}

    # 1. A hardware Xid in the window outranks the crash it caused.
    hw = [x for x in xids if x["hardware"]]
    if hw:
        x = hw[-1]
        return Finding(f"gpu-xid-{x['code']}",
                       f"NVIDIA Xid {x['code']} (hardware/driver) on GPU {x['pci']}; the run then ended with {exit_desc}",
                       base + [y["line"] for y in hw], xid=x["code"], pci=x["pci"])

    # 2. A kernel OOM kill tied to the run.
    run_pids = _run_pids(props if current else {}, status if current else {}, inv)
    host_cg = host_memcg(evidence)
    tied = []
    for oom in ooms:
        memcg = (oom.get("task_memcg") or "") + " " + (oom.get("oom_memcg") or "")
        if any(u in memcg for u in unit_names):
            tied.append((oom, f"its cgroup names {unit}"))
        elif oom["pid"] in run_pids:
            tied.append((oom, f"pid {oom['pid']} was the run's"))
        elif (sig == 9 and killed and not memcg_names_other_unit(oom.get("task_memcg"), unit_names)
              and memcg_in_host(oom.get("task_memcg"), host_cg)
              and oom.get("ts") is not None and facts["ts"] is not None
              and -OOM_TIME_TIE_S <= oom["ts"] - facts["ts"] <= 2.0):
            tied.append((oom, f"killed {facts['ts'] - oom['ts']:.1f} s before the unit's SIGKILL, in this host's "
                              f"cgroup {oom.get('task_memcg') or '?'} (tied by time: pid namespaces differ)"))
    if tied:
        oom, why = tied[-1]
        host_wide = oom.get("constraint") == "CONSTRAINT_NONE" or (
            oom.get("constraint") is None and oom.get("memcg_kill") is False)
        verdict = "host-oom-kill" if host_wide else "cgroup-oom-kill"
        what = "the whole host ran out of memory" if host_wide else f"memory cgroup limit ({oom.get('oom_memcg') or oom.get('task_memcg') or 'cgroup'})"
        return Finding(verdict, f"kernel OOM killer killed {oom.get('comm')} pid {oom['pid']}: {what}; {why}",
                       base + oom["lines"], oom_pid=oom["pid"], constraint=oom.get("constraint"))
    if facts["result"] == "oom-kill" or inv.oom_line:
        proof = base + ([jline(None, inv.oom_line)] if inv.oom_line else [])
        limit = props.get("MemoryMax", "")
        return Finding("cgroup-oom-kill",
                       f"systemd reports an OOM kill in the unit's cgroup (Result=oom-kill, MemoryMax={limit or '?'})"
                       + ("" if kernel_readable else "; kernel log unreadable, whether the host or the limit ran out is not known"),
                       proof)

    # 3. Signatures in the trainer's own output.
    hit = _grep(app, r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError")
    if hit:
        return Finding("cuda-oom", f"GPU memory exhausted: {hit[1].strip()[:200]}", base + [jline(*hit)])
    disks = evidence.get("disk") or {}
    disk = disks.get("checkpoints") or disks.get("output_dir") or {}
    free = ""
    if disk.get("free_bytes") is not None:
        where = disk.get("path") + (f" -> {disk['realpath']}" if disk.get("realpath") else "")
        free = f"; {_size(disk['free_bytes'])} free now on {where}"
    saving = " during a checkpoint save" if _grep(app, r"checkpoint|\.tmp-step-") else ""
    hit = _grep(app, r"No space left on device|\[Errno 28\]")
    if hit:
        return Finding("disk-full", f"No space left on device{saving}{free}", base + [jline(*hit)])
    # torch.save's zip writer does not say ENOSPC: a short write surfaces as "unexpected pos" or
    # "PytorchStreamWriter failed writing file". Disk-full only when the filesystem is full now.
    hit = _grep(app, RE_TORCH_SHORT_WRITE)
    if hit and saving and _nearly_full(disk):
        return Finding("disk-full", f"the checkpoint save failed: a write came up short (torch: {hit[1].strip()[:120]}) "
                       f"on a full filesystem{free}", base + [jline(*hit)])
    # A multi-node run's trainer says when another node went first (docs/trainer.md): this host's
    # ranks failed because that one did, whatever exception their collectives raised.
    hit = _grep(app, messages.PEER_FAILURE_RE)
    if hit:
        line = hit[1].strip()
        account = line[line.index(messages.ERROR_PREFIX) + len(messages.ERROR_PREFIX):].strip()
        return Finding("peer-failure", account[:300], base + [jline(*hit)])
    hit = _grep(app, r"Watchdog caught collective operation timeout")
    if hit:
        return Finding("nccl-timeout", f"NCCL collective timed out: {hit[1].strip()[:200]}", base + [jline(*hit)])
    if facts["result"] == "watchdog" or inv.watchdog_line:
        proof = base + ([jline(None, inv.watchdog_line)] if inv.watchdog_line else [])
        tail = [jline(ts, line) for ts, line in app[-3:]]
        return Finding("watchdog-hang", "no WATCHDOG=1 within WatchdogSec: systemd killed the hung trainer"
                       + (f" (last output: {app[-1][1].strip()[:120]})" if app else ""), proof + tail)

    # 4. The trainer's deterministic config error (exit EX_CONFIG, one stderr line).
    hit = _grep(app, messages.CONFIG_ERROR_RE)
    if hit or (code == "exited" and sig == messages.EX_CONFIG):
        text = hit[1].strip() if hit else f"exit status {messages.EX_CONFIG} (config error)"
        return Finding("crash", text, base + ([jline(*hit)] if hit else []),
                       "fix the run configuration as the message says, then train.yml", kind="config-error")

    # 5. Outside signals vs. crashes.
    exc, exc_lines = _last_exception(app)
    app_xids = [x for x in xids if x["application"]]
    xid_note = ""
    if app_xids:
        x = app_xids[-1]
        xid_note = f"; Xid {x['code']} (application fault, not hardware) on {x['pci']}"
    if killed and sig is not None and sig not in CRASH_SIGNALS and not exc:
        if inv.stopping:
            return Finding("stopped", f"stopped through systemd, ended by {exit_desc}",
                           base + [jline(None, inv.stopping_line)])
        reason = f"killed by {exit_desc} from outside the run"
        if sig == 9:
            if not kernel_readable:
                reason += f"; kernel log unreadable, OOM not ruled out ({kernel_reason(evidence)})"
            else:
                others = [o for o in ooms]
                reason += ("; no OOM kill of the run in the kernel log" if not others else
                           f"; the kernel log's OOM kill(s) in the window name other processes ({', '.join(o.get('comm') or '?' for o in others)})")
        lines = base + [line for o in ooms for line in o["lines"]]
        return Finding("killed-by-signal", reason, lines, signal=sig)

    if code in ("exited", "killed", "dumped") or facts["result"] not in (None, "success"):
        hint = None
        if exc:
            hint = _hint(exc) or _hint(" ".join(line for _, line in app[-50:]))
            reason = f"{exc[:240]} ({exit_desc}){xid_note}"
        else:
            reason = f"{exit_desc}, no traceback in the journal{xid_note}"
            hint = _hint(" ".join(line for _, line in app[-50:]))
        lines = base + exc_lines + [x["line"] for x in app_xids]
        return Finding("crash", reason, lines, hint, exception=exc)

    gaps = []
    if not (evidence.get("journal") or {}).get("readable", True):
        gaps.append("journal unreadable")
    if not facts["code"]:
        gaps.append("systemd's exit record is gone (unit unloaded or reset)")
    return Finding("unknown", f"unit is {props.get('ActiveState', '?')} and nothing explains how it ended"
                   + (f": {', '.join(gaps)}" if gaps else f" ({exit_desc})")
                   + (f"; status.json last said phase={status.get('phase')} step={status.get('step')}" if status else ""),
                   base + ([f"status.json: phase={status.get('phase')} updated {fmt_time(status_time(status.get('updated')))}"] if status else []))


def _nearly_full(disk: dict) -> bool:
    free, total = disk.get("free_bytes"), disk.get("total_bytes")
    if free is None:
        return False
    return free < NEARLY_FULL_BYTES or (bool(total) and free < NEARLY_FULL_FRACTION * total)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def kernel_reason(evidence: dict) -> str:
    return str((evidence.get("kernel") or {}).get("error") or "not readable")


# ---------------------------------------------------------------------------------------------
# command line


def _evidence_files(args: list[str]) -> list[Path]:
    files = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            files.extend(sorted(p.glob("*/evidence.json")) or sorted(p.glob("evidence.json")))
        else:
            files.append(p)
    return files


# Verdicts that are not a failure: a run that was fine, or never ran, did not "go first".
# peer-failure is a failure, but never the first: the host says another one went before it.
NOT_FAILURES = {"running", "completed", "not-started", "stopped", "unreachable", "no-evidence", "unknown",
                "peer-failure"}


def first_failure(rows: list[dict]) -> dict | None:
    """The host whose run died first, by its unit's exit time: in a multi-node run the others
    usually fail because that one did (a collective or rendezvous error). A host whose unit has
    already been restarted counts with the death before it. Host clocks must agree (NTP); None
    when no host failed with a known exit time."""
    deaths = []
    for r in rows:
        prev = r.get("previous") or {}
        if r.get("verdict") not in NOT_FAILURES and r.get("ended_at") is not None:
            deaths.append((r["ended_at"], r.get("host"), r.get("verdict")))
        elif prev.get("verdict") not in NOT_FAILURES and prev.get("ended_at") is not None:
            deaths.append((prev["ended_at"], r.get("host"), prev.get("verdict")))
    if not deaths:
        return None
    ended_at, host, verdict = min(deaths, key=lambda d: d[0])
    return {"host": host, "verdict": verdict, "ended_at": ended_at}


def table(rows: list[dict]) -> str:
    head = ("host", "verdict", "step", "newest checkpoint", "reason")
    data = [(str(r.get("host") or "?"), str(r.get("verdict")), str(r.get("step") if r.get("step") is not None else "-"),
             str(r.get("newest_checkpoint") or "-"), str(r.get("reason") or "")[:160]) for r in rows]
    widths = [max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(head)]
    widths[-1] = len(head[-1])
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(d, widths, strict=True)).rstrip() for d in data]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    if not argv or "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0 if argv else 2
    results = []
    for path in _evidence_files(argv):
        try:
            evidence = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read evidence: {exc}", file=sys.stderr)
            return 1
        result = classify(evidence)
        if not result.get("host"):
            result["host"] = path.parent.name
        results.append(result)
    if as_json:
        print(json.dumps(results if len(results) != 1 else results[0], indent=2, sort_keys=True))
    else:
        print(table(results))
        first = first_failure(results) if len(results) > 1 else None
        if first:
            print(f"\nwent first: {first['host']} ({first['verdict']})")
        for r in results:
            print(f"\n[{r['host']}] {r['verdict']}: {r['reason']}")
            for line in r.get("evidence") or []:
                print(f"    {line}")
            if r.get("next_step"):
                print(f"  next: {r['next_step']}")
            for w in r.get("warnings") or []:
                print(f"  warning: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
