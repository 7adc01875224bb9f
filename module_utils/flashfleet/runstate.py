"""Where a run stands on a host: its status.json, the tail of metrics.jsonl, its newest complete
checkpoint, its rendered configuration and its unit's systemd state, read with the run contract's
own readers (contract/). Standard library only and read-only; nothing here raises on a missing or
unreadable file, it says why instead.

Used on hosts by the modules flashfleet_run_state (roles/train_unit: one run) and
flashfleet_run_status (roles/run_status: every run of the inventory in one call), which Ansible
ships with this file as ansible.module_utils.flashfleet.runstate.
"""

from __future__ import annotations

import json
import os
import subprocess

from .contract import checkpoint, layout, metrics, status

TAIL_BYTES = 1 << 20
# systemctl show: what status.yml shows (NRestarts) and what says a run died without saying so.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus")


def read(output_dir: str, tail_bytes: int = TAIL_BYTES, recent: int = 0, checkpoints: bool = False) -> dict:
    """status, status_error, last_step (the newest training-step record, {} when none) and
    metrics_error; with recent > 0 also recent_steps ([time, step] of the last `recent` step
    records, oldest first); with checkpoints also newest_checkpoint ({name, step} of the newest
    checkpoint whose manifest, sizes and header verify, no sha256; None when there is none)."""
    result = {"status": None, "status_error": None, "last_step": {}, "metrics_error": None}
    try:
        result["status"] = status.read(os.path.join(output_dir, layout.STATUS))
    except status.StatusError as e:
        result["status_error"] = str(e)
    steps = []
    try:
        records = metrics.read(os.path.join(output_dir, layout.METRICS), tail_bytes)
        steps = [r for r in records if metrics.is_step(r)]
        result["last_step"] = steps[-1] if steps else {}
    except OSError as e:
        result["metrics_error"] = f"{os.path.join(output_dir, layout.METRICS)}: {e.strerror or e}"
    if recent > 0:
        result["recent_steps"] = [[r.get("time"), r.get(metrics.STEP)] for r in steps[-recent:]]
    if checkpoints:
        try:
            done = checkpoint.complete(os.path.join(output_dir, layout.CHECKPOINTS), check_hashes=False)
        except OSError:
            done = []
        name = os.path.basename(done[-1]) if done else None
        result["newest_checkpoint"] = {"name": name, "step": checkpoint.step_of(name)} if name else None
    return result


def max_steps(config_path: str) -> int | None:
    """`max_steps` of a run's rendered trainer configuration (<config_root>/<run>.json), or None."""
    try:
        with open(config_path) as f:
            value = json.load(f).get("max_steps")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parse_show(text: str) -> dict:
    """`systemctl show` output (key=value lines) as a dict of strings."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def _run(argv, timeout):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
        return p.returncode, p.stdout, p.stderr.strip()
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {timeout} s"


def unit(name: str, timeout: float = 5.0, run=_run) -> dict:
    """{readable, error, properties} of `systemctl show` for the unit (UNIT_PROPERTIES)."""
    rc, out, err = run(["systemctl", "show", name, "--no-pager", "-p", ",".join(UNIT_PROPERTIES)], timeout)
    if rc != 0:
        return {"readable": False, "error": err or f"systemctl exit {rc}", "properties": {}}
    return {"readable": True, "error": None, "properties": parse_show(out)}


def server_units(run_name: str, timeout: float = 5.0, run=_run) -> list[str]:
    """The run's vLLM server units loaded on the host (flashfleet-vllm@<run>-<i>, failed ones too;
    one stopped cleanly may be unloaded and is not listed)."""
    rc, out, _err = run(layout.vllm_list_units_argv(run_name), timeout)
    return layout.vllm_units_listed(run_name, out) if rc == 0 else []


def read_runs(runs_root: str, config_root: str | None, runs, tail_bytes: int = TAIL_BYTES, recent: int = 20,
              timeout: float = 5.0, run=_run) -> dict:
    """{run: read(...) + exists, max_steps, unit, servers ({unit name: unit(...)} of its vLLM server
    units)} for every run name, as status.yml shows them."""
    out = {}
    for name in runs:
        if not layout.RUN_NAME_RE.match(str(name)):
            out[name] = {"error": f"{name!r} is not a valid run name"}
            continue
        output_dir = os.path.join(runs_root, name)
        state = read(output_dir, tail_bytes, recent, checkpoints=True)
        state["exists"] = os.path.isdir(output_dir)
        state["max_steps"] = max_steps(os.path.join(config_root, name + ".json")) if config_root else None
        state["unit"] = unit(layout.unit_name(name), timeout, run)
        state["servers"] = {s: unit(s, timeout, run) for s in server_units(name, timeout, run)}
        out[name] = state
    return out
