"""{{ args | vllm_serve_flags }}: a run's `vllm.args` mapping as `vllm serve` flags, in name order.

    {tensor-parallel-size: 2, enforce-eager: true, enable-prefix-caching: false}
    -> ['--no-enable-prefix-caching', '--enforce-eager', '--tensor-parallel-size', '2']

true is the bare flag, false its --no- form (vLLM's boolean flags take both), a list or mapping
its JSON, anything else its string. A name with a leading dash is refused: names are given bare.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError


def vllm_serve_flags(args):
    out = []
    for name, value in sorted((args or {}).items()):
        name = str(name)
        if name.startswith("-") or not name:
            raise AnsibleFilterError(f"vllm.args key {name!r}: give vLLM's flag name without dashes, "
                                     "e.g. tensor-parallel-size")
        if value is True:
            out.append(f"--{name}")
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, (list, dict)):
            out += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        else:
            out += [f"--{name}", str(value)]
    return out


class FilterModule:
    def filters(self):
        return {"vllm_serve_flags": vllm_serve_flags}
