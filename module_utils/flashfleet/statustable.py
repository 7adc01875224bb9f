"""status.yml's table: one row per run and host, from what flashfleet_run_status read on the host
(flashfleet.runstate.read_runs) and the controller's runs/<run>/<host>/diagnosis.json.

Standard library only; Jinja reaches it through roles/run_status/filter_plugins.

    phase       status.json's phase; not-started (no run directory), no-status (a directory
                without a readable status.json), unreachable, no-state (the module failed)
    step/total  status.json's step / max_steps of the host's rendered RUN.json (else the inventory's)
    rates       target_tokens_per_s and drafter_rows_per_s of the newest optimizer-step record
    ETA         steps left / step rate, the rate taken over the newest optimizer-step records
                (up to `recent`, the trailing stretch whose step and time both increase: a restart
                starts it anew), from their wall-clock `time`, so saves and evaluations in that
                window are counted in. Only while the run is loading, training or saving.
    checkpoint  the newest checkpoint on disk that verifies (manifest, sizes, header; no sha256)
    restarts    the unit's NRestarts
    servers     a run whose target runs in vLLM: its server units active out of those on the host,
                and the ones that are not ("1/2 up; v2-1 failed"); "-" for a run without servers
    verdict     only when the run died: diagnosis.json's verdict if diagnose.yml was run, else
                "run diagnose.yml" (nothing is classified here)
"""

from __future__ import annotations

import json
import math
import os

LIVE_PHASES = ("loading", "training", "saving")
NOT_DEAD_HINT = "run diagnose.yml"
COLUMNS = (("run", "RUN"), ("host", "HOST"), ("phase", "PHASE"), ("unit", "UNIT"), ("steps", "STEP"),
           ("tokens", "TGT TOK/S"), ("rows", "DRF ROWS/S"), ("eta", "ETA"), ("checkpoint", "CHECKPOINT"),
           ("restarts", "RESTARTS"), ("servers", "SERVERS"), ("verdict", "VERDICT"))


def _num(value):
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def step_rate(recent) -> float | None:
    """Optimizer steps per second over the trailing stretch of [time, step] pairs in which both
    increase (a restart resumes at an older step: the stretch starts after it); None if < 2 points."""
    points = [(_num(t), _num(s)) for t, s in (p if isinstance(p, list | tuple) and len(p) == 2 else (None, None)
                                              for p in recent or [])]
    points = [p for p in points if p[0] is not None and p[1] is not None]
    if len(points) < 2:
        return None
    start = len(points) - 1
    while start > 0 and points[start - 1][0] < points[start][0] and points[start - 1][1] < points[start][1]:
        start -= 1
    (t0, s0), (t1, s1) = points[start], points[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def eta_seconds(recent, step, total) -> float | None:
    """Seconds until step reaches total at the recent step rate; None when either is unknown."""
    step, total, rate = _num(step), _num(total), step_rate(recent)
    if step is None or total is None or not rate:
        return None
    return max(0.0, (total - step) / rate)


def duration(seconds) -> str:
    """45s, 3m10s, 1h02m, 2d03h; '?' for None."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def rate(value) -> str:
    value = _num(value)
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def servers_cell(servers: dict | None) -> str | None:
    """"2/2 up", or "1/2 up; v2-1 failed" naming each server unit that is not active (its instance)."""
    if not servers:
        return None
    down = {}
    for name, state in sorted(servers.items()):
        props = (state or {}).get("properties") or {}
        if props.get("ActiveState") != "active":
            down[name.rsplit("@", 1)[-1].removesuffix(".service")] = props.get("ActiveState") or "unreadable"
    up = f"{len(servers) - len(down)}/{len(servers)} up"
    return up if not down else up + "; " + ", ".join(f"{n} {a}" for n, a in down.items())


def read_diagnosis(runs_dir, run, host) -> dict | None:
    """runs_dir/run/host/diagnosis.json (what diagnose.yml stored), or None."""
    if not runs_dir:
        return None
    try:
        with open(os.path.join(runs_dir, run, host, "diagnosis.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def died(phase, unit_props: dict) -> bool:
    """The run failed (status.json says so), or its unit failed, or the unit is down while
    status.json still says the run is live (killed before it could say so)."""
    active = unit_props.get("ActiveState")
    loaded = unit_props.get("LoadState") == "loaded"
    return phase == "failed" or active == "failed" or (phase in LIVE_PHASES and loaded and active == "inactive")


def _row(host, run, **fields) -> dict:
    row = {"run": run, "host": host, "phase": None, "unit": None, "step": None, "total_steps": None,
           "target_tokens_per_s": None, "drafter_rows_per_s": None, "eta_s": None, "newest_checkpoint": None,
           "restarts": None, "servers": None, "died": False, "verdict": None, "action": None, "note": None}
    row.update(fields)
    return row


def run_row(host, run, state, runs_dir=None, inventory_max_steps=None) -> dict:
    """The row of one run on one reached host, from its flashfleet_run_status entry."""
    state = state or {}
    if state.get("error"):
        return _row(host, run, phase="no-state", note=state["error"])
    status = state.get("status") or {}
    last = state.get("last_step") or {}
    props = (state.get("unit") or {}).get("properties") or {}
    if status:
        phase, note = status.get("phase"), status.get("last_error")
    elif not state.get("exists"):
        phase, note = "not-started", None
    else:
        phase, note = "no-status", state.get("status_error")
    step = status.get("step", last.get("step"))
    total = _num(state.get("max_steps")) or _num(inventory_max_steps)
    eta = eta_seconds(state.get("recent_steps"), step, total) if phase in LIVE_PHASES else None
    active = props.get("ActiveState")
    unit = None if props.get("LoadState") in (None, "not-found") else f"{active}/{props.get('SubState')}"
    restarts = props.get("NRestarts")
    row = _row(host, run, phase=phase, unit=unit, step=_num(step), total_steps=total,
               target_tokens_per_s=_num(last.get("target_tokens_per_s")),
               drafter_rows_per_s=_num(last.get("drafter_rows_per_s")), eta_s=eta,
               newest_checkpoint=(state.get("newest_checkpoint") or {}).get("name"),
               restarts=int(restarts) if str(restarts or "").isdigit() else None,
               servers=servers_cell(state.get("servers")), note=note)
    if died(phase, props):
        diagnosis = read_diagnosis(runs_dir, run, host)
        row.update(died=True, verdict=diagnosis.get("verdict") if diagnosis else NOT_DEAD_HINT,
                   action=diagnosis.get("action") if diagnosis else None)
    return row


def host_rows(host, result, runs, runs_dir=None, inventory_max_steps=None) -> list[dict]:
    """The rows of one host: its module result (registered), or why there is none."""
    result = result or {}
    runs = list(runs or [])
    if result.get("unreachable"):
        note = " ".join(str(result.get("msg") or "unreachable").split())[:200]
        return [_row(host, r, phase="unreachable", note=note) for r in runs]
    states = result.get("runs")
    if not isinstance(states, dict):
        note = " ".join(str(result.get("msg") or "no result from the host").split())[:200]
        return [_row(host, r, phase="no-state", note=note) for r in runs]
    maxes = inventory_max_steps or {}
    return [run_row(host, r, states.get(r), runs_dir, maxes.get(r)) for r in runs]


def cells(row) -> dict:
    step = "-" if row.get("step") is None else str(row["step"])
    total = row.get("total_steps")
    live = row.get("phase") in LIVE_PHASES
    eta = duration(row.get("eta_s")) if live else ("done" if row.get("phase") == "completed" else "-")
    return {"run": row.get("run") or "-", "host": row.get("host") or "-", "phase": row.get("phase") or "?",
            "unit": row.get("unit") or "-", "steps": f"{step}/{total if total is not None else '?'}",
            "tokens": rate(row.get("target_tokens_per_s")), "rows": rate(row.get("drafter_rows_per_s")),
            "eta": eta, "checkpoint": row.get("newest_checkpoint") or "-",
            "restarts": "-" if row.get("restarts") is None else str(row["restarts"]),
            "servers": row.get("servers") or "-",
            "verdict": row.get("verdict") or "-"}


def table(rows) -> str:
    """The console table: a header and one line per row, columns padded."""
    body = [cells(r) for r in rows]
    widths = {k: max([len(h)] + [len(c[k]) for c in body]) for k, h in COLUMNS}
    lines = ["  ".join(h.ljust(widths[k]) for k, h in COLUMNS).rstrip()]
    lines += ["  ".join(c[k].ljust(widths[k]) for k, _ in COLUMNS).rstrip() for c in body]
    return "\n".join(lines)
