"""Filters that put the classifier (flashfleet.classify, module_utils/flashfleet/classify/) into Jinja.

The classifier is part of the installed project (`pip install -e .` in the controller's venv),
which also gives it the `flashfleet-classify` command for offline use.
"""

from __future__ import annotations

try:
    from flashfleet import classify
except ImportError as exc:  # say what to do instead of "no filter named flashfleet_classify"
    raise ImportError(f"{exc}: the flashfleet project is not installed in the Python that runs Ansible "
                      "(pip install -e . in the controller's venv)") from exc


def flashfleet_classify(evidence):
    """evidence dict (from the flashfleet_evidence module) -> diagnosis dict."""
    return classify.classify(dict(evidence))


def flashfleet_verdict_table(rows):
    """list of diagnosis rows -> the console table, as a list of lines."""
    return classify.table([dict(r) for r in rows]).splitlines()


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
    return classify.first_failure([dict(r) for r in rows])


class FilterModule:
    def filters(self):
        return {"flashfleet_classify": flashfleet_classify, "flashfleet_verdict_table": flashfleet_verdict_table,
                "flashfleet_rows": flashfleet_rows, "flashfleet_first_failure": flashfleet_first_failure}
