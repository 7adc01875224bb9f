#!/usr/bin/python
"""Ansible module flashfleet_gpu_check: the GPU health check of this host, and its quarantine.

A thin wrapper: the logic is flashfleet.gpu_health.host.check_host (module_utils/flashfleet/gpu_health).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.contract.quarantine import QuarantineError
from ansible.module_utils.flashfleet.gpu_health.host import check_host

DOCUMENTATION = r"""
module: flashfleet_gpu_check
short_description: Check the health of a host's GPUs; quarantine the ones that fail
description:
  - Refuses first when a GPU of I(gpus) is quarantined (C(refused) names each, with why), unless it is
    the one I(clear) names. Then runs nvidia-smi -q, reads the kernel log's Xids since boot, runs
    dcgmi diag -r I(level) where DCGM is installed and the trainer's probe (matmul, all-reduce), all
    within I(budget_s), and judges one row per GPU by UUID.
  - Writes the check's evidence file and quarantines each GPU that fails (unless I(record) is false);
    with I(clear), releases that GPU if it passes now. In check mode it reads and measures only.
  - On a host without nvidia-smi it returns C(skipped) and nothing else.
options:
  runs_root: {description: The runs' directory; the quarantine is in its .gpu-health/., type: path, required: true}
  gpus: {description: GPU indices (nvidia-smi's); empty for every GPU., type: list, elements: int, default: []}
  level: {description: 1 quick, 2-4 DCGM's longer levels., type: int, default: 1}
  budget_s: {description: Seconds the whole check may take., type: float, default: 120}
  probe_python: {description: The trainer venv's python (matmul and all-reduce)., type: path}
  settings: {description: Threshold overrides (flashfleet.gpu_health.settings)., type: dict, default: {}}
  record: {description: Quarantine the GPUs that fail., type: bool, default: true}
  clear: {description: A quarantined GPU's UUID to release if it passes now., type: str, default: ""}
  cleared_by: {description: Who clears (recorded)., type: str, default: ""}
author: [flashfleet]
"""

EXAMPLES = r"""
- name: Check the run's GPUs
  flashfleet_gpu_check:
    runs_root: /var/lib/flashfleet/runs
    gpus: [0, 1, 2, 3]
    probe_python: /opt/flashfleet/venv/bin/python
  register: health
"""

RETURN = r"""
ok: {description: Every GPU (and the all-reduce) passed and none is quarantined., type: bool, returned: always}
skipped: {description: Why nothing was checked (no nvidia-smi)., type: str, returned: when skipped}
refused: {description: One line per quarantined GPU of I(gpus)., type: list, returned: always}
rows: {description: "One per GPU: index, uuid, bus, name, status, findings [check, level, text].", type: list, returned: always}
host: {description: The host's own findings (the all-reduce, an unread kernel log)., type: list, returned: always}
lines: {description: The printed table., type: list, returned: always}
evidence: {description: This check's evidence file., type: str, returned: when written}
recorded: {description: UUIDs quarantined (or given a new reason) by this check., type: list, returned: always}
cleared: {description: The entry released by I(clear)., type: dict, returned: always}
quarantined: {description: Every quarantined GPU of the host now., type: list, returned: always}
elapsed_s: {description: Seconds the check took., type: float, returned: always}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "runs_root": {"type": "path", "required": True},
            "gpus": {"type": "list", "elements": "int", "default": []},
            "level": {"type": "int", "default": 1},
            "budget_s": {"type": "float", "default": 120},
            "probe_python": {"type": "path"},
            "settings": {"type": "dict", "default": {}},
            "record": {"type": "bool", "default": True},
            "clear": {"type": "str", "default": ""},
            "cleared_by": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = check_host(None if module.check_mode else p["runs_root"], p["gpus"] or None, p["level"], p["budget_s"],
                            p["probe_python"], p["settings"], p["record"], p["clear"], p["cleared_by"])
    except (QuarantineError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    result.setdefault("refused", [])
    result.setdefault("recorded", [])
    result.setdefault("cleared", None)
    result.setdefault("rows", [])
    result.setdefault("host", [])
    result.setdefault("quarantined", [])
    module.exit_json(changed=bool(result["recorded"] or result["cleared"]), **result)


if __name__ == "__main__":
    main()
