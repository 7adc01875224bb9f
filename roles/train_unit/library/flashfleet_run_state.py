#!/usr/bin/python
"""Ansible module flashfleet_run_state: a run's status.json and newest optimizer-step record.

A thin wrapper: the logic is flashfleet.runstate.read (module_utils/flashfleet/runstate.py), which
reads on the host with the run contract's own readers (`status.read`, and `metrics.read` of the
tail of metrics.jsonl with `metrics.is_step`, so a line cut by a write in progress and the
evaluation's final record (no loss) are handled as every other reader handles them). Read-only.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet import runstate

DOCUMENTATION = r"""
module: flashfleet_run_state
short_description: Read a flashfleet run's status.json and its newest optimizer-step metrics record
description:
  - Reads C(status.json) and the last I(tail_bytes) of C(metrics.jsonl) in a run's output directory
    with the run contract's readers. Never fails on a missing or unreadable file; it says why instead.
  - Read-only; supports check mode.
options:
  output_dir:
    description: The run's output directory on the host (dflash-train --output-dir).
    type: path
    required: true
  tail_bytes:
    description: How much of the end of metrics.jsonl to read for the newest step record.
    type: int
    default: 1048576
"""

EXAMPLES = r"""
- name: Where the run stands
  flashfleet_run_state:
    output_dir: /var/lib/flashfleet/runs/v2
  register: state
"""

RETURN = r"""
status:
  description: The status record (phase, step, epoch, newest_checkpoint, last_error, ...), or null.
  type: dict
  returned: always
status_error:
  description: Why there is no status record (missing, not JSON, unknown phase), or null.
  type: str
  returned: always
last_step:
  description: The newest training-step record of metrics.jsonl (loss, rates, ...); {} when none.
  type: dict
  returned: always
metrics_error:
  description: Why metrics.jsonl could not be read, or null.
  type: str
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "output_dir": {"type": "path", "required": True},
            "tail_bytes": {"type": "int", "default": runstate.TAIL_BYTES},
        },
        supports_check_mode=True,
    )
    result = runstate.read(module.params["output_dir"], module.params["tail_bytes"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
