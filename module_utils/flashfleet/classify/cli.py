"""Turn one host's evidence (the JSON the flashfleet_evidence module gathers, flashfleet.evidence)
into a verdict.

Standard library only, no Ansible import: the role's filter plugin imports it on the controller
(`from flashfleet import classify`), and a user runs it offline on evidence that diagnose.yml or
collect.yml brought home:

    flashfleet-classify runs/v2/gpu01/evidence.json
    flashfleet-classify runs/v2                        # every host
    flashfleet-classify --json runs/v2/gpu01/evidence.json

(`python -m flashfleet.classify ...` is the same without the console script.)

Exit status: 0; 1 when an evidence file could not be classified (empty, not JSON, not the shape
flashfleet_evidence writes): its host is a `no-evidence` row naming the file and why, also said on
stderr, and every other host is still classified; 2 for no arguments or a directory without evidence.

Rules (see docs/diagnosis.md): one verdict per host, the most specific one the evidence proves,
with the lines that prove it, a next step (a sentence) and an action (machine-readable, ACTIONS).
Every source of the evidence is read: systemd's record and messages, the trainer's output (whole
multi-line exceptions, native aborts), the kernel log (OOM kills, every Xid, the other NVRM lines,
segfault/trap lines naming the faulting library), nvidia-smi's output and the venv drift.
- A hardware Xid in the invocation's window outranks the crash it caused; with several, the first
  is the root and the others are listed.
- A kernel OOM line naming the run's cgroup or one of its pids outranks a bare SIGKILL.
- Host, driver and toolchain findings (driver/library mismatch, a driver too old for the CUDA
  runtime, NVML errors, missing compiler or Python headers) come before blaming the run's
  configuration (exit 78) or a crash that is only their symptom.
- A death before READY is `init-crash`, whatever its cause; the cause is named in `cause`.
  systemd's own start outcomes (`start-limit-hit`, `start-timeout`, `exec-failed`) are verdicts
  of their own.
- SIGKILL with an unreadable kernel log is `killed-by-signal`, "kernel log unreadable, OOM not
  ruled out".
- When nothing proves a cause: `unknown`, with the evidence.
"""

# The command line (this docstring is its --help) and the cross-host views the role's filters use:
# the verdict table and which host went first.

from __future__ import annotations

import json
import sys
from pathlib import Path

from .signatures import VERDICT_ACTIONS
from .verdict import classify


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
    head = ("host", "verdict", "action", "step", "newest checkpoint", "reason")
    data = [(str(r.get("host") or "?"), str(r.get("verdict")),
             str(r.get("action") or VERDICT_ACTIONS.get(str(r.get("verdict")), "-")),
             str(r.get("step") if r.get("step") is not None else "-"),
             str(r.get("newest_checkpoint") or "-"), str(r.get("reason") or "")[:160]) for r in rows]
    widths = [max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(head)]
    widths[-1] = len(head[-1])
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(d, widths, strict=True)).rstrip() for d in data]
    return "\n".join(out)


# The evidence document's shape (flashfleet.evidence.gather): the JSON type of each field the
# classifier reads, where present and not null ("[]": each item of the list).
EVIDENCE_SHAPE = {
    "run": str, "unit": str, "host": str, "collected_at": (int, float), "unit_props": dict,
    "unit_props.properties": dict, "journal": dict, "journal.entries": list, "journal.entries[]": dict,
    "kernel": dict, "kernel.entries": list, "kernel.entries[]": dict, "status": dict, "status.data": dict,
    "checkpoints": dict, "checkpoints.newest": dict, "metrics": dict, "metrics.last": dict, "gpu": dict,
    "gpu.gpus": list, "venv": dict, "venv.drift": list, "venv.drift[]": dict, "cgroup": dict,
    "cgroup.own": list, "disk": dict, "config": dict, "deaths": dict, "deaths.records": list,
    "servers": dict, "servers.units": list, "servers.units[]": dict,
    # Read without a type check by the readers (found by generated evidence: a wrong type crashed them).
    "unit_props.properties.ExecMainStartTimestamp": str, "unit_props.properties.ExecMainExitTimestamp": str,
    "unit_props.properties.Restart": str, "disk.output_dir": dict, "disk.checkpoints": dict,
    "disk.output_dir.path": str, "disk.output_dir.free_bytes": (int, float), "disk.checkpoints.path": str,
    "disk.checkpoints.free_bytes": (int, float),
    "deaths.records[]": dict, "gpu.gpus[]": dict,
}
JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}


def shape_problem(evidence: dict) -> str | None:
    """The first field of `evidence` of the wrong JSON type, as 'field is X, not Y'; None if none."""
    for path, want in EVIDENCE_SHAPE.items():
        node, items = evidence, path.endswith("[]")
        for key in path.removesuffix("[]").split("."):
            node = node.get(key) if isinstance(node, dict) else None
        values = list(enumerate(node)) if items and isinstance(node, list) else [(None, node)]
        for i, v in values:
            # null stands for a field left out, but never for an item of a list (readers take each as is)
            if (v is not None or i is not None) and not isinstance(v, want) or isinstance(v, bool):
                name = path.replace("[]", f"[{i}]")
                got = "a boolean" if isinstance(v, bool) else "null" if v is None else JSON_NAMES.get(type(v), type(v).__name__)
                wanted = JSON_NAMES[want[0] if isinstance(want, tuple) else want]
                return f"{name} is {got}, not {wanted}"
    return None


def _no_evidence(path: Path, why: str) -> dict:
    """The row of a host whose evidence file cannot be classified, its reason also on stderr: the
    other hosts are still classified (one bad file must not hide their verdicts)."""
    print(f"{path}: {why}", file=sys.stderr)
    return {"host": path.parent.name, "verdict": "no-evidence", "action": VERDICT_ACTIONS["no-evidence"],
            "step": None, "newest_checkpoint": None, "reason": f"{path}: {why}"}


def _crash_site(exc: Exception) -> str:
    """Where in the classifier `exc` was raised (module.function), for the owner of that reader."""
    tb = exc.__traceback__
    site = "classify"
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith("flashfleet."):
            site = f"{module.removeprefix('flashfleet.')}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return site


def _classify_file(path: Path) -> dict:
    try:
        evidence = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON, empty
        return _no_evidence(path, f"cannot read evidence: {exc or type(exc).__name__} (fix: collect it again with"
                                  " diagnose.yml or collect.yml)")
    if not isinstance(evidence, dict):
        return _no_evidence(path, f"not evidence: a JSON {type(evidence).__name__}, not an object (fix: collect it"
                                  " again with diagnose.yml or collect.yml)")
    problem = shape_problem(evidence)
    if problem:
        return _no_evidence(path, f"not evidence: {problem} (fix: collect it again with diagnose.yml or collect.yml;"
                                  " an edited file must keep the shape flashfleet_evidence writes)")
    try:
        result = classify(evidence)
    except Exception as exc:  # noqa: BLE001 - a reader's bug on odd evidence must not hide the other hosts
        return _no_evidence(path, f"the classifier failed on this evidence ({_crash_site(exc)}:"
                                  f" {type(exc).__name__}: {exc}); report it with the file")
    if not result.get("host"):
        result["host"] = path.parent.name
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    if not argv or "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0 if argv else 2
    for arg in argv:
        if Path(arg).is_dir() and not _evidence_files([arg]):
            print(f"{arg}: no evidence.json there or in its host directories (fix: run diagnose.yml or "
                  "collect.yml for the run first, then pass runs/<run> or a host's evidence.json)", file=sys.stderr)
            return 2
    results = [_classify_file(path) for path in _evidence_files(argv)]
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
            if r.get("action"):
                print(f"  action: {r['action']}")
            for w in r.get("warnings") or []:
                print(f"  warning: {w}")
    # classify() never says no-evidence itself: such a row is a file that could not be classified.
    return 1 if any(r["verdict"] == "no-evidence" for r in results) else 0

