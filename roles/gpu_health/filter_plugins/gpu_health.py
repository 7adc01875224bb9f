"""Jinja filters of the gpu_health role: the quarantine as lines (flashfleet.contract.quarantine)."""

from __future__ import annotations

from flashfleet.contract import quarantine


def flashfleet_quarantine_lines(hosts, hostvars) -> list[str]:
    """One line per quarantined GPU of each host (their gpu_health_quarantined, read by tasks_from
    read), or a line saying there is none; a host whose quarantine could not be read says so."""
    out = []
    for h in hosts:
        hv = hostvars[h]
        if hv.get("gpu_health_quarantine_error"):
            out.append(f"{h}: quarantine not read: {hv['gpu_health_quarantine_error']}")
        out.extend(f"{h}: {quarantine.describe(e)}" for e in hv.get("gpu_health_quarantined") or [])
    return out or ["no GPU is quarantined on these hosts"]


class FilterModule:
    def filters(self):
        return {"flashfleet_quarantine_lines": flashfleet_quarantine_lines}
