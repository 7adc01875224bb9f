"""Reader of the run's vLLM target servers (evidence.py's gather_servers): one finding per server
that died, and how they change the host's verdict."""

from __future__ import annotations

from ..contract import messages
from .finding import Finding
from .journal import (
    Invocation,
    describe_exit,
    exit_facts,
    invocation_pids,
    jline,
    last_exit_invocation,
    parse_systemd_time,
    split_invocations,
)
from .kernel import kernel_scan
from .output import grep, last_exception, strip_prefix
from .signatures import NEXT_STEPS, SERVER_SIGNATURES


def server_deaths(evidence: dict) -> list[Finding]:
    """One Finding per vLLM server unit of the run whose last invocation that ended failed (a
    server down now, or one that died and was restarted: extra `up_again`), the first to die first."""
    found = []
    for server in (evidence.get("servers") or {}).get("units") or []:
        finding = _server_death(evidence, server)
        if finding is not None:
            found.append(finding)
    return sorted(found, key=lambda f: f.extra.get("ended_at") or 0.0)


def _server_death(evidence: dict, server: dict) -> Finding | None:
    name = server.get("unit") or "?"
    props = ((server.get("unit_props") or {}).get("properties")) or {}
    invocations = split_invocations(((server.get("journal") or {}).get("entries")) or [])
    up = props.get("ActiveState") in ("active", "reloading") or (
        props.get("ActiveState") == "activating" and props.get("SubState") != "auto-restart")
    if up:  # serving (or starting) again: its last earlier invocation that failed, if any
        earlier = [i for i in invocations if i.id != props.get("InvocationID") and (i.exit_code or i.result)]
        failed = [i for i in earlier if _server_failed(i, i.result, i.exit_code, i.exit_status)]
        if not failed:
            return None
        inv, facts = failed[-1], exit_facts({}, failed[-1], current=False)
    else:
        inv = last_exit_invocation(invocations, props)
        facts = exit_facts(props, inv, current=True)
        if not _server_failed(inv, facts["result"], facts["code"], facts["status"]):
            return None  # stopped, or never ran
    end = facts["ts"] or inv.last_ts
    app = inv.app_lines()
    base = [f"{name}: {describe_exit(facts)}" + (f", Result={facts['result']}" if facts["result"] else "")
            + (" (running again since)" if up else "")]
    base += [jline(ts, line) for ts, line in (
        (inv.exit_ts, inv.exit_line), (inv.exit_ts, inv.result_line), (None, inv.start_timeout_line)) if line]

    def finding(verdict, reason, lines, action=None):
        return Finding(verdict, reason, lines, NEXT_STEPS[verdict].replace("SERVER", name), action,
                       server=name, ended_at=end, up_again=up)

    for verdict, rx, what, action in SERVER_SIGNATURES:
        hit = grep(app, rx)
        if hit:
            return finding(verdict, f"{name}: {what}: {strip_prefix(hit[1]).strip()[:300]}",
                           [jline(*hit)] + base, action)
    start = inv.first_ts or (None if up else parse_systemd_time(props.get("ExecMainStartTimestamp")))
    pids = invocation_pids({} if up else props, {}, inv)
    for oom in kernel_scan(evidence, start, end)["ooms"]:
        if oom["pid"] in pids or name in (oom.get("task_memcg") or ""):
            return finding("server-oom", f"{name}: the kernel killed the server for memory ({oom.get('comm')}, pid "
                           f"{oom['pid']})", oom["lines"] + base)
    if facts["result"] == "oom-kill":
        return finding("server-oom", f"{name}: systemd reports an OOM kill in the server's cgroup", base)
    text, lines = last_exception(app)
    last = f": {text}" if text else ""
    if not inv.started:
        how = ("its start timed out (TimeoutStartSec) before the readiness probe's extraction answered"
               if inv.start_timeout_line else f"it ended ({describe_exit(facts)}) before it became ready")
        return finding("server-not-ready", f"{name}: {how}{last}", lines + base,
                       "raise-timeout" if inv.start_timeout_line and not text else None)
    return finding("server-died", f"{name}: died after it became ready ({describe_exit(facts)}){last}",
                   lines + base)


def _server_failed(inv: Invocation, result, code, status) -> bool:
    """The server's invocation ended on its own: a failure systemd reports, a start that timed out,
    or an exit 0 that no stop asked for (vLLM's API server exits 0 once its engine has died)."""
    if inv.start_timeout_line or inv.start_failed or result not in (None, "success"):
        return True
    return code == "exited" and status == 0 and not inv.stopping


def _names_a_server(reason: str, lines: list[str]) -> bool:
    """The trainer's death is a target server's: it printed TARGET_SERVER's line."""
    return any(messages.TARGET_SERVER in text for text in [reason, *lines])


def with_servers(finding: Finding, evidence: dict, warnings: list[str]) -> Finding:
    """The host's finding with the run's vLLM servers that died: the first to die is the verdict
    when the trainer's death names a server or the trainer never started (train.yml stops when a
    server is not ready); it explains the trainer's previous death when the trainer runs again
    after one that named a server; otherwise each is a warning."""
    dead = server_deaths(evidence)
    if not dead:
        return finding
    first = dead[0]
    if finding.verdict == "not-started" or (finding.verdict != "running"
                                            and _names_a_server(finding.reason, finding.lines)):
        others = [{"verdict": d.verdict, "reason": d.reason, "server": d.extra["server"]} for d in dead[1:]]
        return Finding(first.verdict, f"{first.reason}; the trainer: {finding.verdict} ({finding.reason})",
                       first.lines + finding.lines[-2:], action=first.action,
                       trainer={"verdict": finding.verdict, "reason": finding.reason, "action": finding.action},
                       servers=others, **first.extra)
    previous = finding.extra.get("previous")
    if previous and _names_a_server(previous["reason"], previous["evidence"]):
        finding.extra["previous"] = {**previous, "verdict": first.verdict, "reason": first.reason,
                                     "evidence": first.lines + previous["evidence"][-2:], "action": first.action,
                                     "server": first.extra["server"], "trainer": {k: previous[k] for k in ("verdict", "reason")}}
        finding.reason += f"; behind it: {first.verdict} ({first.reason})"
        return finding
    warnings.extend(f"vLLM server {'died (up again)' if d.extra['up_again'] else 'down'}: {d.verdict}: {d.reason}"
                    for d in dead)
    return finding

