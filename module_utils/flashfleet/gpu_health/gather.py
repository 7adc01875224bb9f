"""Running the health check's commands on the host, within one time budget, and reading the same
outputs back from a recorded directory (tests/benchmarks/gpu_health_record.sh writes one).

Each command gets what is left of the budget; one that runs past it is killed and counts as not
run (its check says so). The raw outputs go into the check's evidence file as they came.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from . import dcgm, nvidia_smi, probe, xid

# A recorded directory: one file per command, named as here.
RECORDED = {"nvidia_smi": "nvidia-smi-q.txt", "kernel": "kernel-log.txt", "dcgm": "dcgmi-diag.txt",
            "probe": "probe.json"}


def _run(argv: list[str], deadline: float, env: dict | None = None) -> dict:
    t0 = time.monotonic()
    left = deadline - t0
    if left <= 0:
        return {"argv": argv, "rc": None, "out": "", "err": "not run: the check's time budget was spent", "s": 0.0}
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=left, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", f"killed after {left:.0f} s: the check's time budget ran out"
    except OSError as exc:
        rc, out, err = None, "", f"{argv[0]}: {exc.strerror or exc}"
    return {"argv": argv, "rc": rc, "out": out, "err": err, "s": round(time.monotonic() - t0, 3)}


def boot_time() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError):
        return None


def gather_smi(budget_s: float) -> dict:
    """The first step alone (which GPUs, their UUIDs): {"nvidia_smi": ...} or {"skipped": why}."""
    if not shutil.which("nvidia-smi"):
        return {"skipped": "no nvidia-smi on this host: no GPUs to check",
                "nvidia_smi": {"rc": None, "out": "", "err": "no nvidia-smi on this host", "s": 0.0}}
    return {"nvidia_smi": _run(nvidia_smi.COMMAND, time.monotonic() + float(budget_s))}


def gather(indices: list[int] | None, level: int, budget_s: float, probe_python: str | None,
           smi: dict | None = None) -> dict:
    """The raw outputs: nvidia-smi -q (or `smi`, gather_smi's, already run), the kernel log, dcgmi
    diag (when installed), the probe (when probe_python exists and there are GPUs). indices None:
    every GPU."""
    t0 = time.monotonic()
    raw = {"level": level, "budget_s": budget_s, **(smi or gather_smi(budget_s))}
    deadline = t0 + float(budget_s) - (raw["nvidia_smi"]["s"] if smi else 0.0)
    if raw.get("skipped"):
        return raw
    if shutil.which("journalctl"):
        raw["kernel"] = {**_run(xid.JOURNAL_COMMAND, deadline), "fmt": "journal"}
    else:
        raw["kernel"] = {**_run(xid.DMESG_COMMAND, deadline), "fmt": "dmesg", "boot_time": boot_time()}
    if shutil.which("dcgmi"):
        argv = dcgm.command(level) + (["-i", ",".join(map(str, indices))] if indices else [])
        raw["dcgm"] = {**_run(argv, deadline), "level": level}
    if indices is None:
        parsed = nvidia_smi.parse(raw["nvidia_smi"]["out"]) if raw["nvidia_smi"]["rc"] == 0 else {"gpus": []}
        indices = [g["index"] for g in parsed["gpus"]]
    if not probe_python or not os.path.exists(probe_python):
        raw["probe"] = {"skipped": f"no trainer venv python at {probe_python} (provision.yml installs it)"}
    elif not indices:
        raw["probe"] = {"skipped": "no GPUs"}
    else:
        run = _run(probe.command(probe_python, indices, level), deadline, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        raw["probe"] = {**run, "result": _json_line(run["out"])}
        if raw["probe"]["result"] is None:
            raw["probe"]["skipped"] = f"the probe gave no figures: {(run['err'] or run['out']).strip()[-300:]}"
    raw["elapsed_s"] = round(time.monotonic() - t0, 3)
    return raw


def _json_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def recorded(directory: str, level: int = 1) -> dict:
    """The raw outputs of a recorded directory (a file left out: that source was not there)."""
    def read(name):
        path = os.path.join(directory, RECORDED[name])
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read()
    raw = {"level": level, "budget_s": 0}
    out = read("nvidia_smi")
    raw["nvidia_smi"] = {"rc": 0 if out is not None else None, "out": out or "", "err": "" if out else "not recorded"}
    k = read("kernel")
    raw["kernel"] = {"rc": 0 if k is not None else None, "out": k or "", "err": "" if k is not None else "not recorded",
                     "fmt": "journal"}
    d = read("dcgm")
    if d is not None:
        raw["dcgm"] = {"rc": 0, "out": d, "err": "", "level": level}
    p = read("probe")
    if p is not None:
        raw["probe"] = {"rc": 0, "out": p, "result": _json_line(p)}
    return raw
