"""Every role variable is written once with its comment, in defaults/main.yml, and the role's other
two descriptions of it follow that file: meta/argument_specs.yml (which Ansible validates inputs by)
and the README's variable table (which people read). Ansible does not check those against each other;
this test does, so a variable added to, renamed in or re-defaulted in only one of them fails here.

For every role:
- each top-level variable of defaults/main.yml has a comment where it is defined: on its own line,
  or in the comment that opens its paragraph (a block with no blank line, for a group of variables);
- it is an option of meta/argument_specs.yml (of the entry points that read it), and every entry
  point that lists it gives the same default (none where it is required) and a type that value has;
- it is in the README's variable table (the first column of the table under `## Variables`);
- neither the argument spec nor the table names a top-level variable that defaults/main.yml lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/defaults/main.yml"))
# An inline noqa marker names a lint exception, it explains nothing.
_NOQA = re.compile(r"#\s*noqa\b.*$")
_KEY = re.compile(r"^([a-z][a-z0-9_]*):")
_TYPES = {"str": (str,), "path": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
          "list": (list,), "dict": (dict,)}


def _defaults(role: Path) -> dict:
    return yaml.safe_load((role / "defaults/main.yml").read_text()) or {}


def uncommented(text: str) -> list[str]:
    """The top-level keys of a defaults file with no comment on their line or opening their paragraph."""
    missing, paragraph_commented = [], False
    for line in text.splitlines():
        if not line.strip():
            paragraph_commented = False
            continue
        if line.startswith("#"):
            paragraph_commented = True
            continue
        m = _KEY.match(line)
        if m and not paragraph_commented and "#" not in _NOQA.sub("", line.split(":", 1)[1]):
            missing.append(m.group(1))
    return missing


def spec_problems(defaults: dict, specs: dict) -> list[str]:
    """How meta/argument_specs.yml's entry points disagree with defaults/main.yml."""
    problems = []
    entry_points = (specs or {}).get("argument_specs") or {}
    listed = {k for spec in entry_points.values() for k in ((spec or {}).get("options") or {})}
    problems += [f"{k}: not an option of any entry point" for k in defaults if k not in listed]
    for ep, spec in entry_points.items():
        for k, option in ((spec or {}).get("options") or {}).items():
            where = f"{k} (entry point {ep})"
            if k not in defaults:
                problems.append(f"{where}: not in defaults/main.yml")
                continue
            if option.get("required"):
                if "default" in option:  # Ansible refuses the spec: required and default are exclusive
                    problems.append(f"{where}: required, so it can have no default")
            elif "default" not in option:
                problems.append(f"{where}: no default (defaults/main.yml: {defaults[k]!r})")
            elif option["default"] != defaults[k]:
                problems.append(f"{where}: default {option['default']!r}, defaults/main.yml {defaults[k]!r}")
            kind = option.get("type", "str")
            templated = isinstance(defaults[k], str) and "{{" in defaults[k]
            if kind in _TYPES and not templated and not (
                    isinstance(defaults[k], _TYPES[kind]) and not (kind != "bool" and isinstance(defaults[k], bool))):
                problems.append(f"{where}: type {kind}, default {defaults[k]!r} is not one")
    return problems


def readme_variables(text: str) -> set[str]:
    """The variables named in the first column of the table under the README's `## Variables`."""
    names, in_section = set(), False
    for line in text.splitlines():
        if line.startswith("## "):
            in_section = line.startswith("## Variables")
        elif in_section and line.startswith("|"):
            first = line.split("|")[1]
            names |= {n for n in re.findall(r"`([^`]+)`", first) if re.fullmatch(r"[a-z][a-z0-9_]*", n)}
    return names


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_has_its_comment(role):
    assert uncommented((role / "defaults/main.yml").read_text()) == []


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_the_argument_spec_follows_the_defaults(role):
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    assert spec_problems(_defaults(role), specs) == []


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_the_readme_table_follows_the_defaults(role):
    defaults, table = set(_defaults(role)), readme_variables((role / "README.md").read_text())
    assert {"missing from the README": sorted(defaults - table), "not in defaults": sorted(table - defaults)} == {
        "missing from the README": [], "not in defaults": []}


def test_the_checks_catch_a_variable_added_to_one_place_only():
    defaults = {"r_a": 1, "r_b": "x"}
    specs = {"argument_specs": {"main": {"options": {"r_a": {"type": "int", "default": 1},
                                                     "r_b": {"type": "str", "default": "x"}}}}}
    assert spec_problems(defaults, specs) == []
    assert spec_problems({**defaults, "r_c": 2}, specs) == ["r_c: not an option of any entry point"]
    specs["argument_specs"]["main"]["options"]["r_d"] = {"type": "int", "default": 0}
    assert spec_problems(defaults, specs) == ["r_d (entry point main): not in defaults/main.yml"]
    assert spec_problems({"r_a": 2}, {"argument_specs": {"main": {"options": {"r_a": {"type": "str", "default": 1}}}}}) == [
        "r_a (entry point main): default 1, defaults/main.yml 2", "r_a (entry point main): type str, default 2 is not one"]
    assert spec_problems({"r_a": ""}, {"argument_specs": {"main": {"options": {"r_a": {"required": True}}}}}) == []
    assert spec_problems({"r_a": ""}, {"argument_specs": {"main": {"options": {"r_a": {"required": True, "default": ""}}}}}) == [
        "r_a (entry point main): required, so it can have no default"]
    assert uncommented("---\n# the a\nr_a: 1\nr_b: 2\n\nr_c: 3  # the c\nr_d: 4  # noqa: var-naming\n") == ["r_d"]
    assert readme_variables("## Variables\n| variable | default |\n| --- | --- |\n| `r_a`, `r_b.x` | `1` |\n"
                            "## Tests\n| `r_z` |\n") == {"r_a"}
