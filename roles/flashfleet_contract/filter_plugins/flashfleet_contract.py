"""Jinja filters: the run contract's facts where YAML needs them, read from the Python contract
(module_utils/flashfleet/contract, imported as `flashfleet.contract` from the installed project),
so that no role spells an exit code, a pattern, a file name or a lock rule of its own.

    {{ 'messages.EX_CONFIG' | flashfleet_contract }}              78
    {{ 'messages.START_FAILURE_PATTERN' | flashfleet_contract }}  the journal line a failed start states
    {{ 'layout.STATUS' | flashfleet_contract }}                   status.json
    {{ 'status.FINAL_PHASES' | flashfleet_contract }}             ['completed', 'failed', 'stopped']
    {{ run | flashfleet_unit_name }}                              flashfleet-train@<run>.service
    {{ run | flashfleet_vllm_unit_names(2) }}                     [flashfleet-vllm@<run>-0.service, ...-1...]
    {{ lock_text | flashfleet_lock_problem }}                     '' or why the text is not a lock
    {{ lock_text | flashfleet_lock_pins }}                        {normalized name: version}

`flashfleet_contract` takes `<module>.<CONSTANT>`: any upper-case constant of a contract module
whose value is plain data (a string, a number, a list, a mapping); tuples come back as lists.
"""

from __future__ import annotations

import importlib

from ansible.errors import AnsibleFilterError

MODULES = ("checkpoint", "files", "layout", "locks", "messages", "metrics", "quarantine", "safetensors", "status")
_PLAIN = (str, int, float, bool, type(None))


def _module(name: str):
    if name not in MODULES:
        raise AnsibleFilterError(f"flashfleet_contract: no contract module {name!r} (one of {', '.join(MODULES)})")
    try:
        return importlib.import_module(f"flashfleet.contract.{name}")
    except ImportError as e:
        raise AnsibleFilterError(
            f"flashfleet_contract: cannot import flashfleet.contract ({e}). Fix: run ansible-playbook from the "
            "project's venv (make venv installs the project into .venv)") from None


def _plain(value):
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple | frozenset | set):
        items = [_plain(v) for v in value]
        return sorted(items) if isinstance(value, frozenset | set) else items
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


def flashfleet_contract(name):
    """The value of the contract constant `<module>.<CONSTANT>`, e.g. 'messages.EX_CONFIG' -> 78."""
    module, _, attr = str(name).partition(".")
    mod = _module(module)
    if not attr.isupper() or not hasattr(mod, attr):
        known = sorted(a for a in vars(mod) if a.isupper() and not a.startswith("_"))
        raise AnsibleFilterError(f"flashfleet_contract: {name!r} is not a constant of flashfleet.contract.{module}"
                                 f" (its constants: {', '.join(known)})")
    try:
        return _plain(getattr(mod, attr))
    except TypeError as e:
        raise AnsibleFilterError(f"flashfleet_contract: {name!r} is a {e}, not plain data YAML can use") from None


def flashfleet_unit_name(run):
    """The run's systemd unit, e.g. 'v2' -> 'flashfleet-train@v2.service'."""
    return _module("layout").unit_name(str(run))


def flashfleet_vllm_unit_names(run, servers):
    """{{ run | flashfleet_vllm_unit_names(n) }}: the run's n vLLM server units on a host."""
    return _module("layout").vllm_unit_names(str(run), int(servers))


def flashfleet_lock_problem(text):
    """'' when `text` is a lock by the contract's rules (the drift check's), else why it is not."""
    try:
        _module("locks").parse(str(text))
    except ValueError as e:
        return str(e)
    return ""


def flashfleet_lock_pins(text):
    """{normalized name: version} of a lock's text; an error names the first line that is not a pin."""
    try:
        return _module("locks").parse(str(text))
    except ValueError as e:
        raise AnsibleFilterError(f"flashfleet_lock_pins: {e}") from None


class FilterModule:
    def filters(self):
        return {
            "flashfleet_contract": flashfleet_contract,
            "flashfleet_unit_name": flashfleet_unit_name,
            "flashfleet_vllm_unit_names": flashfleet_vllm_unit_names,
            "flashfleet_lock_problem": flashfleet_lock_problem,
            "flashfleet_lock_pins": flashfleet_lock_pins,
        }
