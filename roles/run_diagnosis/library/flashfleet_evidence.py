#!/usr/bin/python
"""Ansible module: gather the evidence of one flashfleet run on one host, as one JSON document.

The logic is flashfleet.evidence (module_utils/flashfleet/evidence.py), which Ansible ships with
this module as ansible.module_utils.flashfleet.evidence.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: flashfleet_evidence
short_description: Gather the evidence of why a flashfleet training run is (not) running
description:
  - Read-only. Collects the unit's systemd properties, the journal of its recent invocations,
    kernel log lines in the run's window (this boot and the previous one), cgroup memory events,
    status.json, checkpoint state, nvidia-smi CSV, the venv against its lock, and free disk.
  - Anything unreadable (a missing file, a lock that does not parse) is recorded with the reason;
    nothing fails the task but a bad parameter.
  - The returned C(evidence) is what diagnose.yml stores as evidence.json and what the classifier
    (flashfleet.classify, the C(flashfleet-classify) command) reads; it is also the test fixture format.
  - Host paths have no defaults here; the run_diagnosis role passes them.
options:
  run: {description: Run name., type: str, required: true}
  unit: {description: "Unit name (default flashfleet-train@RUN.service).", type: str}
  output_dir: {description: The run's output directory., type: str, required: true}
  config_dir: {description: Directory of rendered run configurations (RUN.json)., type: str, required: true}
  venv: {description: The run's virtual environment., type: str, required: true}
  lock: {description: The lock file the venv was installed from., type: str, required: true}
  journal_lines: {description: Most recent journal entries of the unit to keep., type: int, default: 2000}
  kernel_scan_lines: {description: Most recent kernel log entries to scan per boot., type: int, default: 20000}
  kernel_keep_lines: {description: Most kernel lines of interest to keep., type: int, default: 500}
  command_timeout: {description: Seconds allowed for each command., type: float, default: 5}
  checksum: {description: Verify checkpoint sha256 sums from the manifest (slow on large files)., type: bool, default: false}
  shm: {description: Shared-memory mount to report free space of., type: str, default: /dev/shm}
author: [flashfleet]
"""

EXAMPLES = r"""
- name: Gather evidence
  flashfleet_evidence:
    run: v2
    output_dir: /var/lib/flashfleet/runs/v2
    config_dir: /etc/flashfleet/runs
    venv: /opt/flashfleet/venv
    lock: /opt/flashfleet/venv/flashfleet.lock
  register: ev
"""

RETURN = r"""
evidence:
  description: The evidence document (schema 1); see docs/diagnosis.md.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.flashfleet.evidence import EvidenceError, gather  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run=dict(type="str", required=True),
            unit=dict(type="str"),
            output_dir=dict(type="str", required=True),
            config_dir=dict(type="str", required=True),
            venv=dict(type="str", required=True),
            lock=dict(type="str", required=True),
            journal_lines=dict(type="int", default=2000),
            kernel_scan_lines=dict(type="int", default=20000),
            kernel_keep_lines=dict(type="int", default=500),
            command_timeout=dict(type="float", default=5),
            checksum=dict(type="bool", default=False),
            shm=dict(type="str", default="/dev/shm"),
        ),
        supports_check_mode=True,
    )
    try:
        evidence = gather(module.params)
    except EvidenceError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, evidence=evidence)


if __name__ == "__main__":
    main()
