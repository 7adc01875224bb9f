#!/usr/bin/python
"""Ansible module flashfleet_gpu_devices: open each NVIDIA device node a run needs and say why one fails.

Why a module: in an LXC guest, "no GPU" has three causes on two machines (the node never passed
through, passed without its cgroup allow entry, or passed with no driver behind it on the host),
and only the errno of a real open() tells them apart. Read-only: each node is opened and closed.
It lives in the contract role because every role depends on that one (nvidia_driver's guest
check and train_unit's preflight both call it). The logic is module_utils/flashfleet/gpu_devices.py.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.gpu_devices import check, problem

DOCUMENTATION = r"""
module: flashfleet_gpu_devices
short_description: Check the NVIDIA device nodes (control nodes and the given GPUs) are present and open
options:
  gpus: {description: GPU indexes whose /dev/nvidia<N> must open., type: list, elements: int, required: true}
  dev: {description: The device directory., type: path, default: /dev}
  in_guest: {description: This host is an LXC guest (the nodes come from its hypervisor)., type: bool, default: false}
  fail: {description: Fail with one line per problem., type: bool, default: true}
  host: {description: The name each line starts with (the inventory name)., type: str, default: this host}
"""

RETURN = r"""
nodes: {description: "One row per node: node, gpu, state (ok, missing, denied, no-driver, other), detail.", type: list, returned: always}
problems: {description: One line per node that does not open, naming the cause and the fix., type: list, returned: always}
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "int", "required": True},
            "dev": {"type": "path", "default": "/dev"},
            "in_guest": {"type": "bool", "default": False},
            "fail": {"type": "bool", "default": True},
            "host": {"type": "str", "default": "this host"},
        },
        supports_check_mode=True,
    )
    p = module.params
    rows = check(p["gpus"], p["dev"])
    problems = [m for r in rows if (m := problem(r, p["host"], p["in_guest"]))]
    if problems and p["fail"]:
        module.fail_json(msg=" ".join(problems), nodes=rows, problems=problems)
    module.exit_json(changed=False, nodes=rows, problems=problems)


if __name__ == "__main__":
    main()
