"""{{ entry | dflash_data_flags }}: a run's `data:` mapping as dflash-data flags, in name order.

    {input: [a.jsonl, b.jsonl], max_len: 2048, shuffle: true, seed: null}
    -> ['--input', 'a.jsonl', 'b.jsonl', '--max-len', '2048', '--shuffle']

Names take dashes for underscores; true is the bare flag, false and null leave the flag out, a list
gives its items after the flag, anything else its string. A name with a leading dash is refused:
names are given bare, as the trainer's configuration keys are.
"""

from __future__ import annotations


def name_problem(name: str) -> str | None:
    if name.startswith("-") or not name:
        return f"data key {name!r}: give dflash-data's flag name without dashes, e.g. max_len"
    return None


def dflash_data_flags(entry):
    out = []
    for name, value in sorted((entry or {}).items()):
        name = str(name)
        if problem := name_problem(name):
            # Ansible imported only here: importing it patches sys.intern for the whole process,
            # which breaks torch's compiler in a test process that loads this file.
            from ansible.errors import AnsibleFilterError

            raise AnsibleFilterError(problem)
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


class FilterModule:
    def filters(self):
        return {"dflash_data_flags": dflash_data_flags}
