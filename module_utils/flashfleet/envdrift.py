"""A venv against its lock (the logic of the python_env role's module python_env_drift).

The lock rules and the comparison are the contract's (`contract.locks`: one rule set for this
check and for diagnose's evidence); what is here is asking the venv's own interpreter what it has,
so the check sees exactly what the trainer will import.
"""

import json
import subprocess

from .contract import locks

DEFAULT_IGNORE = ("pip", "setuptools", "wheel", "flashfleet")


def installed_distributions(python: str) -> dict[str, str]:
    """{normalized name: version} of what `python` imports (OSError, CalledProcessError, ValueError)."""
    out = subprocess.run([python, "-c", locks.LIST_INSTALLED_SCRIPT], capture_output=True, text=True, check=True)
    return {locks.normalize(k): v for k, v in json.loads(out.stdout).items()}


class DriftError(Exception):
    """The check could not run, or (fail_on_drift) found drift; `result` goes with the message."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


def check(python: str, lock_text: str, lock_name: str = "(given content)", ignore=DEFAULT_IGNORE,
          fail_on_drift: bool = False) -> dict:
    """The module's result: {"changed", "drift", "installed", "table"}; DriftError otherwise."""
    try:
        locked = locks.parse(lock_text)
    except ValueError as e:
        raise DriftError(f"lock {lock_name}: {e}. Fix: regenerate it with `make lock`.") from None
    try:
        installed = installed_distributions(python)
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        raise DriftError(f"cannot list the venv's packages with {python}: {e}. "
                         "Fix: run provision.yml (python_env) to create the venv.") from None
    drift = locks.compare(locked, installed, ignore)
    table = locks.table(drift)
    result = {"changed": False, "drift": drift, "installed": installed, "table": table}
    if drift and fail_on_drift:
        raise DriftError(f"the venv differs from the lock in {len(drift)} package(s):\n{table}\n"
                         "Fix: run provision.yml to re-sync the venv (or re-lock if the change is wanted).",
                         **result)
    return result


def run_module(module) -> None:
    """The python_env_drift module's body, given its AnsibleModule."""
    p = module.params
    text = p["lock_content"]
    if text is None:
        try:
            with open(p["lock"], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            module.fail_json(msg=f"lock {p['lock']}: {e}. Fix: regenerate it with `make lock`.")
    try:
        result = check(p["python"], text, p["lock"] or "(given content)", p["ignore"], p["fail_on_drift"])
    except DriftError as e:
        module.fail_json(msg=str(e), **e.result)
    module.exit_json(**result)
