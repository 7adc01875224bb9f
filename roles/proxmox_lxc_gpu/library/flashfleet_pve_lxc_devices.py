#!/usr/bin/python
"""Ansible module flashfleet_pve_lxc_devices: write one Proxmox VE container's NVIDIA device entries.

Why a module: the entries depend on the host's real device nodes (dynamic majors), must replace
exactly the lines they own in a file Proxmox and people also edit, and must say whether the running
guest has them yet. The logic is module_utils/flashfleet/pve_lxc.py.
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.pve_lxc import ConfigProblem, entries, host_nodes, rewrite

DOCUMENTATION = r"""
module: flashfleet_pve_lxc_devices
short_description: Write a Proxmox VE container's NVIDIA device entries from the host's device nodes
description:
  - Reads the host's /dev/nvidiactl, /dev/nvidia<N> of the given GPUs, /dev/nvidia-uvm(-tools) and
    /dev/nvidia-caps/*, and writes their entries into the container's config, replacing the entries
    it owns (mount and devN entries of /dev/nvidia*, allow lines of the NVIDIA majors, the lines of
    the record) and keeping every other line.
  - Reports the entries, and whether they differ from the ones the guest last started with (the
    record of applied entries), so the caller restarts only guests that need it.
options:
  ctid: {description: The container's id., type: int, required: true}
  config_dir: {description: Where Proxmox keeps container configs., type: path, default: /etc/pve/lxc}
  dev: {description: The host's device directory., type: path, default: /dev}
  gpus: {description: The GPU indexes to pass., type: list, elements: int, required: true}
  style: {description: "lxc (raw lxc.* keys) or dev (devN entries, Proxmox VE 8.2+).", type: str, choices: [lxc, dev], default: lxc}
  applied: {description: The record of the entries the guest last started with (read only here)., type: path, required: true}
"""

RETURN = r"""
entries: {description: The entry lines now in the config., type: list, returned: success}
pending: {description: True when the entries differ from what the guest last started with., type: bool, returned: success}
config: {description: The config file., type: str, returned: success}
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "ctid": {"type": "int", "required": True},
            "config_dir": {"type": "path", "default": "/etc/pve/lxc"},
            "dev": {"type": "path", "default": "/dev"},
            "gpus": {"type": "list", "elements": "int", "required": True},
            "style": {"type": "str", "choices": ["lxc", "dev"], "default": "lxc"},
            "applied": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    conf = os.path.join(p["config_dir"], f"{p['ctid']}.conf")
    if not os.path.isfile(conf):
        module.fail_json(msg=f"CT {p['ctid']} has no config at {conf}: it is not a container of this host. "
                             "Fix: correct the guest's flashfleet_lxc_host / flashfleet_lxc_ctid in the inventory.")
    try:
        nodes = host_nodes(p["dev"], p["gpus"])
    except ConfigProblem as e:
        module.fail_json(msg=f"CT {p['ctid']}: {e}.")
    applied = None
    if os.path.isfile(p["applied"]):
        with open(p["applied"]) as f:
            applied = [line for line in f.read().splitlines() if line]
    with open(conf) as f:
        text = f.read()
    new, now, before = rewrite(text, entries(nodes, p["style"]), {n["major"] for n in nodes}, set(applied or []))
    # With no record yet, the entries found in the file are what the guest runs with (written by
    # hand before flashfleet managed them): equal ones need no restart.
    pending = sorted(now) != sorted(applied if applied is not None else before)
    changed = new != text
    if changed and not module.check_mode:
        tmp = f"{conf}.flashfleet.tmp"
        with open(tmp, "w") as f:
            f.write(new)
        os.replace(tmp, conf)
    module.exit_json(changed=changed, entries=now, pending=pending, config=conf)


if __name__ == "__main__":
    main()
