#!/usr/bin/python
"""Ansible module flashfleet_gpu_quarantine: read a host's GPU quarantine, or add the GPUs a
diagnosis names to it.

A thin wrapper: the file is flashfleet.contract.quarantine's; GPUs named by PCI address are found
through `nvidia-smi -q` (flashfleet.gpu_health.nvidia_smi).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.contract import quarantine
from ansible.module_utils.flashfleet.gpu_health import gather, nvidia_smi

DOCUMENTATION = r"""
module: flashfleet_gpu_quarantine
short_description: Read a host's GPU quarantine, or quarantine GPUs by PCI address
description:
  - I(state=read) returns the quarantined GPUs (read-only; a missing file is an empty quarantine).
  - I(state=present) quarantines each GPU of I(pcis) (the kernel's Xid notation, 0000:3b:00) with
    I(reason), I(action) and I(evidence), source "diagnose"; the same record twice changes nothing.
options:
  runs_root: {description: The runs' directory; the quarantine is in its .gpu-health/., type: path, required: true}
  state: {description: read or present., type: str, choices: [read, present], default: read}
  pcis: {description: PCI addresses of the GPUs to quarantine., type: list, elements: str, default: []}
  reason: {description: Why., type: str, default: ""}
  action: {description: The verdict's action., type: str, default: ""}
  evidence: {description: The evidence file., type: str, default: ""}
author: [flashfleet]
"""

EXAMPLES = r"""
- name: Quarantine the GPU a Xid 79 names
  flashfleet_gpu_quarantine:
    runs_root: /var/lib/flashfleet/runs
    state: present
    pcis: ["0000:3b:00"]
    reason: "gpu-xid-79: GPU has fallen off the bus"
    action: reboot-node
    evidence: runs/v2/node1/evidence.json
"""

RETURN = r"""
quarantined: {description: Every quarantined GPU of the host (entries)., type: list, returned: always}
recorded: {description: UUIDs this call quarantined or gave a new reason., type: list, returned: always}
unmatched: {description: PCI addresses no GPU of the host has., type: list, returned: always}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "runs_root": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["read", "present"], "default": "read"},
            "pcis": {"type": "list", "elements": "str", "default": []},
            "reason": {"type": "str", "default": ""},
            "action": {"type": "str", "default": ""},
            "evidence": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    path = quarantine.path_for(p["runs_root"])
    recorded, unmatched = [], []
    try:
        if p["state"] == "present" and p["pcis"]:
            smi = gather.gather_smi(30)
            if smi.get("skipped") or smi["nvidia_smi"]["rc"] != 0:
                module.fail_json(msg=f"cannot find the GPUs {p['pcis']} to quarantine: "
                                     f"{smi.get('skipped') or smi['nvidia_smi']['err'].strip()}")
            by_bus = {nvidia_smi.bus_key(g["bus"]): g for g in nvidia_smi.parse(smi["nvidia_smi"]["out"])["gpus"]}
            for pci in p["pcis"]:
                g = by_bus.get(nvidia_smi.bus_key(pci))
                if g is None:
                    unmatched.append(pci)
                    continue
                if module.check_mode:
                    continue
                _entry, changed = quarantine.record(path, g["uuid"], p["reason"], "diagnose", p["evidence"],
                                                    action=p["action"], pci=g["bus"], name=g["name"] or "")
                if changed:
                    recorded.append(g["uuid"])
        doc = quarantine.read(path)
    except (quarantine.QuarantineError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(recorded), recorded=recorded, unmatched=unmatched,
                     quarantined=list(quarantine.quarantined(doc).values()))


if __name__ == "__main__":
    main()
