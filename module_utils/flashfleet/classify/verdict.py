"""One host's verdict: the unit's state (running, never started), else its last death explained by
the rules (rules.py), then wrapped where systemd's start says more (start-limit-hit, init-crash)
and joined with the run's vLLM servers (servers.py)."""

from __future__ import annotations

import time

from ..contract import layout
from .finding import Finding
from .gpu import gpu_findings
from .journal import (
    as_int,
    exit_facts,
    fmt_time,
    jline,
    journal_is_complete,
    last_exit_invocation,
    parse_systemd_time,
    split_invocations,
    status_time,
)
from .kernel import kernel_scan
from .rules import Death, decide
from .servers import with_servers
from .signatures import SCHEMA, START_OUTCOMES


def classify(evidence: dict) -> dict:
    """The diagnosis of one host: verdict, one-line reason, proving lines, next step, action, facts."""
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
    gpu = evidence.get("gpu") or {}
    if gpu.get("present") and gpu.get("readable") is False:
        warnings.append(f"nvidia-smi failed: {str(gpu.get('error') or '?').splitlines()[0][:200]}")

    finding = with_servers(_decide(evidence, run, unit, props, status, invocations, warnings), evidence, warnings)
    deaths = death_rows(evidence)
    if finding.verdict == "running" and not finding.extra.get("previous") and deaths:
        # The journal has moved on (rotated, or cut at its line cap): the death recorded at the time says it.
        last = deaths[-1]
        finding.extra["previous"] = {"verdict": last["verdict"], "reason": last["reason"], "evidence": [],
                                     "ended_at": last["ended_at"], "action": last["action"], "record": last["record"]}
        finding.reason += f"; last recorded death ({last['record']}): {last['verdict']} ({last['reason']})"
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
        # Every death the host recorded at the moment it happened (deaths/, flashfleet.death), oldest first.
        "deaths": deaths,
        "classified_at": time.time(),
    }
    if out.get("next_step"):
        out["next_step"] = out["next_step"].replace("RUN", run).replace("UNIT", unit)
    return out



def death_rows(evidence: dict) -> list[dict]:
    """One row per death record in the evidence (deaths.records): the verdict made at the time."""
    rows = []
    for rec in (evidence.get("deaths") or {}).get("records") or []:
        v = rec.get("verdict") if isinstance(rec.get("verdict"), dict) else {}
        death = v.get("death") if isinstance(v.get("death"), dict) else {}
        rows.append({"record": rec.get("name"), "verdict": v.get("verdict") or "unreadable",
                     "reason": v.get("reason") or rec.get("error") or "", "action": v.get("action"),
                     "result": death.get("result"), "ended_at": v.get("ended_at"),
                     "recorded_at": death.get("recorded_at")})
    return rows


def _props_line(props: dict) -> str:
    return "systemctl: " + " ".join(
        f"{k}={props[k]}" for k in ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode",
                                    "ExecMainStatus", "NRestarts") if k in props)


def _decide(evidence, run, unit, props, status, invocations, warnings) -> Finding:
    active = props.get("ActiveState", "")
    sub = props.get("SubState", "")
    load = props.get("LoadState", "")
    unit_props = evidence.get("unit_props") or {}
    journal_readable = (evidence.get("journal") or {}).get("readable", True)
    props_line = _props_line(props)

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
    target = last_exit_invocation(invocations, props)
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
                        "ended_at": earlier[-1].exit_ts, "action": prev.action}
            if nrestarts:
                reason += f"; restarted {nrestarts}x, last death: {prev.verdict} ({prev.reason})"
            else:  # started again by hand (train.yml), not by Restart=
                reason += f"; an earlier invocation ended: {prev.verdict} ({prev.reason})"
    # Hardware trouble while running is worth saying even if the run survived it.
    start = parse_systemd_time(props.get("ExecMainStartTimestamp"))
    scan = kernel_scan(evidence, start, None)
    for x in scan["xids"]:
        if x["hardware"]:
            warnings.append(f"hardware Xid {x['code']} on {x['pci']} while running ({x['action']}): {x['line']}")
    for h in scan["nvrm"] + gpu_findings(evidence):
        warnings.append(f"{h['kind']} while running ({h['action']}): {h['line']}")
    return Finding("running", reason, lines, previous=previous)





def last_death(evidence: dict) -> Death:
    """The Death the rules read for this host's last invocation that ended (as classify() builds it
    for a unit that is down): for tests and for reading one rule's view of the evidence."""
    run = evidence.get("run") or "?"
    unit = evidence.get("unit") or layout.unit_name(run)
    props = ((evidence.get("unit_props") or {}).get("properties")) or {}
    status = ((evidence.get("status") or {}).get("data")) or {}
    invocations = split_invocations(((evidence.get("journal") or {}).get("entries")) or [])
    return death(evidence, unit, props, status, last_exit_invocation(invocations, props), _props_line(props), True)


def death(evidence, unit, props, status, inv, props_line, current) -> Death:
    """What the rules read about how `inv` ended: systemd's facts, the kernel log of its window, its output."""
    facts = exit_facts(props, inv, current)
    start = inv.first_ts or (parse_systemd_time(props.get("ExecMainStartTimestamp")) if current else None)
    end = facts["ts"] or inv.last_ts
    scan = kernel_scan(evidence, start, end)
    app = inv.app_lines()
    base = [line for line in (props_line,) if line]
    if facts.get("stale_record"):
        base.append(f"systemctl: {facts['stale_record']}: this death's facts are the journal's")
    if inv.exit_line:
        base.append(jline(inv.exit_ts, inv.exit_line))
    if inv.result_line:
        base.append(jline(inv.exit_ts, inv.result_line))
    if inv.started_line:
        base.append(f"journal: {inv.started_line} (READY=1 received)")
    # systemd refused a further start: the unit will not restart; the death before it is the cause.
    limit_hit = facts["result"] == "start-limit-hit" or inv.start_limit_line is not None
    if limit_hit:
        prior = [r for r in inv.results if r != "start-limit-hit"]
        facts = dict(facts, result=prior[-1] if prior else None)
        if inv.start_limit_line:
            base.append(jline(inv.start_limit_ts, inv.start_limit_line))
    d = Death(evidence, unit, props, status if current else {}, inv, facts, scan, app, base, current)
    d.start, d.end, d.limit_hit = start, end, limit_hit
    return d


def _explain_death(evidence, run, unit, props, status, inv, props_line, warnings, current) -> Finding:
    d = death(evidence, unit, props, status, inv, props_line, current)
    start, end = d.start, d.end
    ready = inv.started
    if not ready and not inv.start_failed and current and status:
        # Journal may have been cut (journal line cap) or unreadable: fall back to the trainer's status.
        first_seen = inv.first_ts
        if status.get("ready") and (first_seen is None or not journal_is_complete(evidence)):
            ready = True

    cause = decide(d)
    if d.limit_hit:
        burst, interval = props.get("StartLimitBurst"), props.get("StartLimitIntervalUSec")
        limit = (f" ({burst} starts within {interval})" if burst and interval else
                 f" (after {inv.restarts} automatic restarts)" if inv.restarts else "")
        return Finding("start-limit-hit",
                       f"the unit hit its start limit{limit}: systemd refused the next start ('Start request repeated "
                       f"too quickly') and will not start it again until `systemctl reset-failed {unit}`; the run before "
                       f"it ended: {cause.verdict}: {cause.reason}", cause.lines,
                       action="reset-failed",
                       cause={"verdict": cause.verdict, "reason": cause.reason, "action": cause.action, **cause.extra})
    if cause.verdict in START_OUTCOMES:
        return cause
    if not ready:
        when = (f"{(end - start):.0f} s after start" if (start is not None and end is not None and end >= start)
                else "during start-up")
        return Finding("init-crash", f"died before READY ({when}): {cause.reason}", cause.lines, cause.next_step,
                       action=cause.action,
                       cause={"verdict": cause.verdict, "reason": cause.reason, "action": cause.action, **cause.extra})
    return cause
