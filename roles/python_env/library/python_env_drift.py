#!/usr/bin/python
"""Compare the distributions installed in a venv with a pip lock file.

Why a module: a drifted package decides whether a run lives (incidents.md: wandb 0.27 plus
pydantic v2 rejected settings that older pairs silently dropped), so the check must be exact,
cheap, read-only, and give a table a person can act on. It asks the venv's own interpreter for
its distributions (importlib.metadata), so it sees exactly what the trainer will import.
"""

from __future__ import annotations

import json
import re
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: python_env_drift
short_description: Compare a venv's installed distributions with a pip lock file
description:
  - Reads C(name==version) lines of a lock (comments and blank lines ignored), asks the venv's
    interpreter for its installed distributions, and reports every difference.
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

_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)$")
_LIST_SCRIPT = (
    "import importlib.metadata as m, json;"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def normalize(name: str) -> str:
    """PEP 503 normalization: 'Pydantic_Core' and 'pydantic-core' are the same distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, str]:
    """Return {normalized name: version}; raise ValueError naming the first line that is not a pin."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            raise ValueError(f"line {number} is not a name==version pin: {raw.strip()!r}")
        pins[normalize(match.group(1))] = match.group(3)
    if not pins:
        raise ValueError("the lock has no pins")
    return pins


def compare(locked: dict[str, str], installed: dict[str, str], ignore: list[str]) -> list[dict]:
    """Every locked package that is missing or at another version, then every unlocked extra."""
    ignored = {normalize(n) for n in ignore}
    drift = [
        {"package": name, "locked": version, "installed": installed.get(name)}
        for name, version in sorted(locked.items())
        if installed.get(name) != version
    ]
    drift += [
        {"package": name, "locked": None, "installed": version}
        for name, version in sorted(installed.items())
        if name not in locked and name not in ignored
    ]
    return drift


def format_table(drift: list[dict]) -> str:
    if not drift:
        return "venv matches the lock"
    rows = [("package", "locked", "installed")] + [
        (d["package"], d["locked"] or "(not locked)", d["installed"] or "(missing)") for d in drift
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def installed_distributions(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-c", _LIST_SCRIPT], capture_output=True, text=True, check=True)
    return {normalize(k): v for k, v in json.loads(out.stdout).items()}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "lock": {"type": "path"},
            "lock_content": {"type": "str"},
            "ignore": {"type": "list", "elements": "str", "default": ["pip", "setuptools", "wheel", "flashfleet"]},
            "fail_on_drift": {"type": "bool", "default": False},
        },
        required_one_of=[("lock", "lock_content")],
        mutually_exclusive=[("lock", "lock_content")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        text = p["lock_content"]
        if text is None:
            with open(p["lock"], encoding="utf-8") as f:
                text = f.read()
        locked = parse_lock(text)
    except (OSError, ValueError) as e:
        module.fail_json(msg=f"lock {p['lock'] or '(given content)'}: {e}. Fix: regenerate it with `make lock`.")
    try:
        installed = installed_distributions(p["python"])
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        module.fail_json(msg=f"cannot list the venv's packages with {p['python']}: {e}. "
                             "Fix: run provision.yml (python_env) to create the venv.")
    drift = compare(locked, installed, p["ignore"])
    table = format_table(drift)
    result = {"changed": False, "drift": drift, "installed": installed, "table": table}
    if drift and p["fail_on_drift"]:
        module.fail_json(msg=f"the venv differs from the lock in {len(drift)} package(s):\n{table}\n"
                             "Fix: run provision.yml to re-sync the venv (or re-lock if the change is wanted).",
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
