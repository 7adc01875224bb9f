"""Filters that put status.yml's table (flashfleet.statustable, module_utils/flashfleet/statustable.py)
into Jinja. The flashfleet project is installed in the controller's venv (pip install -e .)."""

from __future__ import annotations

try:
    from flashfleet import statustable
except ImportError as exc:  # say what to do instead of "no filter named flashfleet_status_rows"
    raise ImportError(f"{exc}: the flashfleet project is not installed in the Python that runs Ansible "
                      "(pip install -e . in the controller's venv)") from exc


def _plain(value):
    """Ansible's lazy containers as plain dicts and lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def flashfleet_status_rows(result, host, runs, runs_dir=None, runs_def=None):
    """This host's rows: its registered flashfleet_run_status result (or why there is none).
    runs_def (flashfleet_runs) gives each run's max_steps where the host has no rendered RUN.json."""
    runs_def = _plain(runs_def or {})
    max_steps = {name: ((d or {}).get("trainer") or {}).get("max_steps")
                 for name, d in runs_def.items() if isinstance(d, dict)}
    return statustable.host_rows(str(host), _plain(result), [str(r) for r in runs or []], runs_dir, max_steps)


def flashfleet_status_collect(hosts, hostvars, fact="run_status_rows"):
    """Every host's rows, in host order; a host without them gets one row saying so."""
    rows = []
    for host in hosts:
        try:
            own = hostvars[host].get(fact)
        except (KeyError, AttributeError):
            own = None
        rows.extend(_plain(own) if own else statustable.host_rows(str(host), {}, ["*"]))
    return rows


def flashfleet_status_table(rows):
    """The console table as a list of lines."""
    return statustable.table(_plain(rows)).splitlines()


class FilterModule:
    def filters(self):
        return {"flashfleet_status_rows": flashfleet_status_rows,
                "flashfleet_status_collect": flashfleet_status_collect,
                "flashfleet_status_table": flashfleet_status_table}
