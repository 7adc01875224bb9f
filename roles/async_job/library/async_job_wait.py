#!/usr/bin/python
"""Ansible module async_job_wait: one wait of a poll of an async job (the logic is
module_utils/flashfleet/jobwait.py, shipped to the host with the module)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.jobwait import wait, wait_seconds

DOCUMENTATION = r"""
module: async_job_wait
short_description: Wait a little for an async job, ending within a second of its end
description:
  - Waits as long as the job has run so far (at least 1 s, at most I(interval)), a second at a
    time, and returns as soon as the job's results file no longer says C("finished": false).
  - Read-only; never changes anything.
options:
  results_file:
    description: The job's results file on the host (C(results_file) of the task registered with
      C(async) and C(poll: 0)). Empty or absent, the module waits the whole time.
    type: str
    default: ""
  interval:
    description: The poll's interval, the longest wait.
    type: float
    required: true
  elapsed:
    description: Seconds the job has run so far (computed on the controller, whose clock began it).
    type: float
    required: true
  read:
    description: A command run after the wait, its output returned as C(stdout) (what the poll
      reports: a log's last line, a unit's state), so one look is one task. Its failure is not the
      module's; C(rc) says it.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Wait a little (less once the build has ended)
  async_job_wait:
    results_file: "{{ kernel_poll_job.results_file }}"
    interval: "{{ kernel_poll_delay_s }}"
    elapsed: "{{ now().timestamp() - kernel_poll_started | float }}"
    read: [tail, -n, 1, "{{ kernel_poll_log }}"]
"""

RETURN = r"""
waited:
  description: Seconds waited.
  type: int
  returned: always
stdout:
  description: The output of I(read), empty without one.
  type: str
  returned: always
rc:
  description: The exit status of I(read), 0 without one.
  type: int
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "results_file": {"type": "str", "default": ""},
            "interval": {"type": "float", "required": True},
            "elapsed": {"type": "float", "required": True},
            "read": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    waited = wait(p["results_file"], wait_seconds(p["interval"], p["elapsed"]))
    rc, out = module.run_command(p["read"])[:2] if p["read"] else (0, "")
    module.exit_json(changed=False, waited=waited, rc=rc, stdout=out)


if __name__ == "__main__":
    main()
