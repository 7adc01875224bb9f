#!/usr/bin/python
"""Ansible module python_env_drift: compare the distributions installed in a venv with a pip lock.

Why a module: a drifted package decides whether a run lives (incidents.md: wandb 0.27 plus
pydantic v2 rejected settings that older pairs silently dropped), so the check must be exact,
cheap, read-only, and give a table a person can act on. It asks the venv's own interpreter for
its distributions (importlib.metadata), so it sees exactly what the trainer will import.

Its options are declared here; the logic is module_utils/flashfleet/envdrift.py and the lock
rules are the run contract's (flashfleet.contract.locks), shipped to the host with the module.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.envdrift import DEFAULT_IGNORE, run_module

DOCUMENTATION = r"""
module: python_env_drift
short_description: Compare a venv's installed distributions with a pip lock file
description:
  - Reads the pins of a lock (C(name==version), with optional extras, C(; markers) and C(--hash)
    options, continued with a backslash; comments, blank lines and option lines such as
    C(--index-url) ignored; any other line is an error naming it), asks the venv's interpreter for
    its installed distributions, and reports every difference.
  - Names compare PEP 503-normalized; versions as pip installs them (PEP 440), so a pin without a
    local label (C(2.13.0)) accepts an installed build with one (C(2.13.0+cpu)); a pin with a local
    label must match exactly.
  - Read-only; never changes anything.
options:
  python:
    description: The venv's interpreter.
    type: path
    required: true
  lock:
    description: Path of the lock file on the host. One of lock or lock_content is required.
    type: path
  lock_content:
    description: The lock file's text (for example read on the controller).
    type: str
  ignore:
    description: Distributions never reported as extra (the venv's seed tools and the project).
    type: list
    elements: str
    default: [pip, setuptools, wheel, flashfleet]
  fail_on_drift:
    description: Fail with the table when anything differs.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Compare the trainer venv with the repository's lock, failing with a table on drift
  python_env_drift:
    python: /opt/flashfleet/venv/bin/python
    lock_content: "{{ lookup('ansible.builtin.file', 'requirements/node-cpu.lock') }}"
    fail_on_drift: true
"""

RETURN = r"""
drift:
  description: One entry per difference, with package, locked and installed (null when absent).
  type: list
  returned: always
installed:
  description: Installed distributions, normalized name to version.
  type: dict
  returned: always
table:
  description: The differences as a fixed-width table.
  type: str
  returned: always
"""

def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "lock": {"type": "path"},
            "lock_content": {"type": "str"},
            "ignore": {"type": "list", "elements": "str", "default": list(DEFAULT_IGNORE)},
            "fail_on_drift": {"type": "bool", "default": False},
        },
        required_one_of=[("lock", "lock_content")],
        mutually_exclusive=[("lock", "lock_content")],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
