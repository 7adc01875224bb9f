#!/usr/bin/python
"""Ansible module flashfleet_run_status: where every given run stands on this host, in one call.

A thin wrapper: the logic is flashfleet.runstate.read_runs (module_utils/flashfleet/runstate.py),
the readers flashfleet_run_state (roles/train_unit) uses too, plus the run's rendered max_steps and
`systemctl show` of its unit. Read-only; a run that never started on the host is a result, not an error.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet import runstate

DOCUMENTATION = r"""
module: flashfleet_run_status
short_description: Read the status, newest metrics, newest checkpoint and unit state of flashfleet runs
description:
  - For each run, reads C(RUNS_ROOT/RUN/status.json), the last I(tail_bytes) of C(metrics.jsonl)
    (the newest I(recent) optimizer-step records), the newest complete checkpoint (manifest, sizes
    and header; no sha256), C(max_steps) of C(CONFIG_ROOT/RUN.json) and C(systemctl show) of the
    run's unit. Never fails on a missing or unreadable file; it says why instead.
  - Read-only; supports check mode.
options:
  runs_root:
    description: Parent of each run's output directory on the host.
    type: path
    required: true
  config_root:
    description: Where each run's rendered trainer configuration RUN.json lies.
    type: path
  runs:
    description: Run names.
    type: list
    elements: str
    required: true
  tail_bytes:
    description: How much of the end of each metrics.jsonl to read.
    type: int
    default: 262144
  recent:
    description: How many of the newest optimizer-step records to return as [time, step] pairs.
    type: int
    default: 20
  command_timeout:
    description: Seconds allowed for each systemctl call.
    type: float
    default: 5
author: [flashfleet]
"""

EXAMPLES = r"""
- name: Where every run stands
  flashfleet_run_status:
    runs_root: /var/lib/flashfleet/runs
    config_root: /etc/flashfleet/runs
    runs: [demo, v2]
  register: state
"""

RETURN = r"""
runs:
  description: >-
    {run: {status, status_error, last_step, metrics_error, recent_steps, newest_checkpoint, exists,
    max_steps, unit: {readable, error, properties}}}.
  type: dict
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "runs_root": {"type": "path", "required": True},
            "config_root": {"type": "path"},
            "runs": {"type": "list", "elements": "str", "required": True},
            "tail_bytes": {"type": "int", "default": 262144},
            "recent": {"type": "int", "default": 20},
            "command_timeout": {"type": "float", "default": 5},
        },
        supports_check_mode=True,
    )
    p = module.params
    runs = runstate.read_runs(p["runs_root"], p["config_root"], p["runs"], p["tail_bytes"], p["recent"],
                              p["command_timeout"])
    module.exit_json(changed=False, runs=runs)


if __name__ == "__main__":
    main()
