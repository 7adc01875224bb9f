"""Jinja filters of the dataset role's validation (tasks/validate.yml): the entries and settings that
cannot work, all of them at once, before any host is touched. The rules a staging run obeys are the
staging module's own (flashfleet.stage, module_utils/flashfleet/stage.py: the S3 URL form and the
setting ranges it refuses again on the host), imported from the installed project.

    {{ dataset_data | flashfleet_dataset_entry_problems(dataset_models) }}   ['model big: src ...', ...]
    {{ {'concurrency': ..., 'retries': ..., 'free_margin_ratio': ..., 'free_margin_bytes': ...}
       | flashfleet_dataset_setting_problems }}                                ['concurrency 0 is outside 1-256 ...']
"""

from __future__ import annotations

import importlib
import re


def _error(text: str) -> Exception:
    # Ansible imported only where a filter fails: importing it patches sys.intern for the whole
    # process, which breaks torch's compiler in a test process that loads this file.
    from ansible.errors import AnsibleFilterError

    return AnsibleFilterError(text)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _stage():
    try:
        return importlib.import_module("flashfleet.stage")
    except ImportError as e:
        raise _error(
            f"flashfleet_dataset: cannot import flashfleet.stage ({e}). Fix: run ansible-playbook from the "
            "project's venv (make venv installs the project into .venv)") from None


def flashfleet_dataset_entry_problems(data, models) -> list[str]:
    """Why entries of dataset_data and dataset_models cannot be staged: a name that is not a directory
    name, a source of no known form, an https source with nothing to list it, a manifest that is not
    a mapping, names given twice within a kind."""
    stage = _stage()
    entries = [dict(e, kind="data") for e in data or []] + [dict(e, kind="model") for e in models or []]
    out = []
    for e in entries:
        name, src = str(e.get("name", "")), str(e.get("src", ""))
        where = f"{e['kind']} {name or '?'}: "
        if not _NAME.match(name):
            out.append(where + "name must be [A-Za-z0-9._-] (a directory name)")
        why = stage.source_problem(src)
        if why:
            out.append(where + why)
        if re.match(r"^https?://", src) and not e.get("manifest") and not e.get("files"):
            out.append(where + "an https source cannot be listed; give a manifest or a files list")
        if "manifest" in e and not isinstance(e["manifest"], dict):
            out.append(where + "manifest must be {path: {size, sha256}}")
    for kind in ("data", "model"):
        names = [e.get("name") for e in entries if e["kind"] == kind]
        if len(names) != len({str(n) for n in names}):
            out.append(f"{kind} names are not unique: {', '.join(map(str, names))}")
    return out


def flashfleet_dataset_setting_problems(settings) -> list[str]:
    """'<what> (fix: <how>)' for each staging setting the module would refuse."""
    try:
        values = (int(settings["concurrency"]), int(settings["retries"]), float(settings["free_margin_ratio"]),
                  int(settings["free_margin_bytes"]))
    except (KeyError, TypeError, ValueError) as e:
        raise _error(f"flashfleet_dataset_setting_problems: {e}") from None
    return [f"{what} (fix: {fix})" for what, fix in _stage().setting_problems(*values)]


class FilterModule:
    def filters(self):
        return {"flashfleet_dataset_entry_problems": flashfleet_dataset_entry_problems,
                "flashfleet_dataset_setting_problems": flashfleet_dataset_setting_problems}
