"""Every role variable is written once, with its description, in the role's meta/argument_specs.yml
(which Ansible validates inputs by); defaults/main.yml and the README's variable table are generated
from it by tests/roledocs.py (`make role-docs`). Ansible never reads the README and takes the
defaults file as it is, so this test is what keeps the three equal: a generated file that differs from
what the generator writes now fails here, with the command that fixes it.

The comment rule (every variable commented where it is defined) is kept where it is defined now: every
option of every entry point has a description, and the generated defaults carry it above each variable.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests import roledocs
from tests.conftest import ROOT

ROLES = roledocs.roles()
_KEY = re.compile(r"^([a-z][a-z0-9_]*):")
_NOQA = re.compile(r"#\s*noqa\b.*$")  # an inline noqa marker names a lint exception, it explains nothing
_TYPES = {"str": (str,), "path": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
          "list": (list,), "dict": (dict,)}


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


def undescribed(options: dict, prefix: str = "") -> list[str]:
    """The options, nested ones included (`parent.child`), that have no description."""
    out = []
    for name, option in (options or {}).items():
        if not roledocs.description(option):
            out.append(prefix + name)
        out += undescribed(option.get("options"), f"{prefix}{name}.")
    return out


def mistyped(options: dict, prefix: str = "") -> list[str]:
    """The options whose default is not of their type (a Jinja string is left to Ansible)."""
    out = []
    for name, option in (options or {}).items():
        kind, value = option.get("type", "str"), option.get("default")
        templated = isinstance(value, str) and "{{" in value
        if "default" in option and kind in _TYPES and not templated and not (
                isinstance(value, _TYPES[kind]) and (kind == "bool" or not isinstance(value, bool))):
            out.append(f"{prefix}{name}: type {kind}, default {value!r}")
        out += mistyped(option.get("options"), f"{prefix}{name}.")
    return out


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_the_generated_files_are_the_generators(role):
    for path, text in roledocs.generated(role).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `{roledocs.FIX}`"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_option_is_described_where_it_is_defined(role):
    for ep, spec in roledocs.load(role).items():
        assert undescribed(spec.get("options")) == [], f"{role.name}, entry point {ep}"
    assert uncommented((role / "defaults/main.yml").read_text()) == []


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_is_of_its_type(role):
    for ep, spec in roledocs.load(role).items():
        assert mistyped(spec.get("options")) == [], f"{role.name}, entry point {ep}"


def test_every_role_with_defaults_has_a_spec():
    assert sorted(p.parent.parent for p in (ROOT / "roles").glob("*/defaults/main.yml")) == ROLES


# ---- the generator and the check on a role of their own -------------------------------------------

SPEC = """---
argument_specs:
  main:
    short_description: A role
    options:
      r_name: &r_name
        type: str
        required: true
        description: The name.
      r_items:
        type: list
        elements: str
        default: [a, b]
        description: "Items, with a | in the text."
      r_jinja:
        type: path
        default: "{{ r_name }}/x"
        description: A path below the name.
  other:
    short_description: Another entry point
    options:
      r_name: *r_name
"""
README = f"# r\n\n## Variables\n{roledocs.BEGIN}\n{roledocs.END}\n\n## Tests\nnone\n"


@pytest.fixture
def role(tmp_path) -> Path:
    r = tmp_path / "roles/r"
    (r / "meta").mkdir(parents=True)
    (r / "meta/argument_specs.yml").write_text(SPEC)
    (r / "README.md").write_text(README)
    return r


def write(role: Path) -> None:
    for path, text in roledocs.generated(role).items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)


def test_the_generator_writes_the_defaults_and_the_table(role):
    write(role)
    defaults = (role / "defaults/main.yml").read_text()
    assert yaml.safe_load(defaults) == {"r_name": "", "r_items": ["a", "b"], "r_jinja": "{{ r_name }}/x"}
    assert "# The name.\nr_name: \"\"\n" in defaults and uncommented(defaults) == []
    readme = (role / "README.md").read_text()
    assert "| `r_name` | str | required | The name. |" in readme
    assert "| `r_items` | list of str | `[a, b]` | Items, with a \\| in the text. |" in readme
    assert "- `other`: Another entry point; reads `r_name`." in readme
    assert readme.endswith(f"{roledocs.END}\n\n## Tests\nnone\n")  # the hand-written rest is kept


def test_a_hand_edit_of_a_generated_file_or_a_changed_spec_is_stale(role, tmp_path):
    write(role)
    assert roledocs.stale(tmp_path) == []
    defaults = role / "defaults/main.yml"
    defaults.write_text(defaults.read_text().replace("[a, b]", "[a, b, c]"))
    assert roledocs.stale(tmp_path) == [defaults]
    write(role)
    spec = role / "meta/argument_specs.yml"
    spec.write_text(spec.read_text().replace("description: The name.", "description: The run's name."))
    assert roledocs.stale(tmp_path) == [defaults, role / "README.md"]


@pytest.mark.parametrize("edit, problem", [
    (("        description: The name.\n", ""), "r_name (entry point main) has no description"),
    (("        required: true\n", "        required: true\n        default: x\n"), "required and has a default"),
    (("        default: [a, b]\n", ""), "r_items (entry point main) has no default"),
    (("      r_name: *r_name\n", "      r_name:\n        type: str\n        default: y\n        description: N.\n"),
     "r_name (entry point other): default 'y', another entry point's ''"),
])
def test_a_spec_the_generator_cannot_write_from_is_named(role, edit, problem):
    spec = role / "meta/argument_specs.yml"
    spec.write_text(spec.read_text().replace(*edit))
    with pytest.raises(roledocs.SpecError, match=re.escape(problem)):
        roledocs.generated(role)


def test_a_readme_without_the_generated_block_is_named(role):
    (role / "README.md").write_text("# r\n\n## Variables\n| old | table |\n")
    with pytest.raises(roledocs.SpecError, match="r/README.md has no generated variables block"):
        roledocs.generated(role)


def test_check_exits_1_naming_the_stale_file_and_writes_nothing(role, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "roles/build_toolchain", tmp_path / "roles/build_toolchain")
    monkeypatch.setattr(roledocs, "ROOT", tmp_path)
    assert roledocs.main(["--check"]) == 1
    assert "roles/r/defaults/main.yml: stale, run `make role-docs`" in capsys.readouterr().out
    assert not (role / "defaults").exists()
    assert roledocs.main([]) == 0 and roledocs.main(["--check"]) == 0


@pytest.mark.parametrize("value", ["", "6.1", "-ff", "a: b", "x #y", "{{ j }}", "yes", "/", "null", "0750", "é"])
def test_a_scalar_reads_back_as_itself(value):
    assert yaml.safe_load(f"k: {roledocs.scalar(value)}") == {"k": value}


@pytest.mark.parametrize("value", ["https://h/x-{{ v }}/y-{{ v }}.run" * 6, "a  b " * 40, "word" * 40])
def test_a_long_value_is_written_within_the_width_and_reads_back(value):
    lines = roledocs.block("k", value)
    assert yaml.safe_load("\n".join(lines)) == {"k": value}
    folded = " " in value and "  " not in value
    assert all(len(line) <= roledocs.WIDTH for line in lines) == folded and (lines[0] == "k: >-") == folded
