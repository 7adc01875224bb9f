"""Filters that put the role's pure-Python classifier (files/flashfleet_classify.py) into Jinja.

The classifier stays a plain script so it runs offline too; this file only loads it.
"""

from __future__ import annotations

import importlib.util
import os

_CLASSIFIER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "files",
                           "flashfleet_classify.py")
_module = None


def _classifier():
    global _module
    if _module is None:
        spec = importlib.util.spec_from_file_location("flashfleet_classify", _CLASSIFIER)
        _module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_module)
    return _module


def flashfleet_classify(evidence):
    """evidence dict (from the flashfleet_evidence module) -> diagnosis dict."""
    return _classifier().classify(dict(evidence))


def flashfleet_verdict_table(rows):
    """list of diagnosis rows -> the console table, as a list of lines."""
    return _classifier().table([dict(r) for r in rows]).splitlines()


def flashfleet_rows(hosts, hostvars, fact="run_diagnosis_result"):
    """One summary row per host, from each host's `fact`; a host without one gets a row saying so."""
    rows = []
    for host in hosts:
        try:
            row = hostvars[host].get(fact)
        except (KeyError, AttributeError):
            row = None
        if not row:
            row = {"host": host, "verdict": "no-evidence", "step": None, "newest_checkpoint": None,
                   "reason": "no result from this host (not reached, or the play failed before evidence)"}
        rows.append(dict(row))
    return rows


def flashfleet_first_failure(rows):
    """The row of the host whose run died first (by exit time), or None."""
    return _classifier().first_failure([dict(r) for r in rows])


class FilterModule:
    def filters(self):
        return {"flashfleet_classify": flashfleet_classify, "flashfleet_verdict_table": flashfleet_verdict_table,
                "flashfleet_rows": flashfleet_rows, "flashfleet_first_failure": flashfleet_first_failure}
