"""Jinja filters: the run plan (module_utils/flashfleet/plan, imported as `flashfleet.plan` from the
installed project), the one place a run's entry becomes what a host receives. The roles render its
answer and derive nothing of it themselves.

    {{ run | flashfleet_plan(spec, hosts=ansible_play_hosts_all, host=inventory_hostname, ...) }}
        {'unit': ..., 'trainer': {...}, 'servers': [...], 'gpus': [...], 'data': {...}, ...}
    {{ selected | flashfleet_run_problems(flashfleet_runs) }}
        ['run v2: flashfleet_runs.v2.trainer must be a mapping, not a list: ...', ...]   ([] when usable)
"""

from __future__ import annotations

import importlib

from ansible.errors import AnsibleFilterError


def _plan(module: str):
    try:
        return importlib.import_module(f"flashfleet.plan.{module}")
    except ImportError as e:
        raise AnsibleFilterError(
            f"flashfleet_plan: cannot import flashfleet.plan ({e}). Fix: run ansible-playbook from the "
            "project's venv (make venv installs the project into .venv)") from None


def flashfleet_plan(run, entry, **where):
    """This host's share of the run (flashfleet.plan.run.plan_run); a malformed entry fails with its problems."""
    run_module = _plan("run")
    try:
        return run_module.plan_run(str(run), entry, **where)
    except run_module.PlanError as e:
        raise AnsibleFilterError(str(e)) from None


def flashfleet_run_problems(selected, runs):
    """The problems of the selected runs' entries of flashfleet_runs, each naming the field and the fix."""
    return _plan("entry").run_problems(selected, runs)


class FilterModule:
    def filters(self):
        return {"flashfleet_plan": flashfleet_plan, "flashfleet_run_problems": flashfleet_run_problems}
