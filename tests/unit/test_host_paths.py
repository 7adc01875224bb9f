"""The project's host paths (the trainer's venv, the runs' directories, ...) have one owner:
roles/flashfleet_contract/defaults/main.yml. Roles default their own variables to it
(`"{{ flashfleet_venv }}"`), Molecule's plays read it with vars_files, Python tests through
tests/host_paths.py. This test fails when one of those paths is spelled anywhere else in the tree,
except where quoting it is documentation or data:

- Markdown, and comments in YAML, Python, shell and templates;
- Python docstrings and an Ansible module's DOCUMENTATION/EXAMPLES/RETURN;
- the owner's argument spec (tests/unit/test_role_variables.py holds it equal to the owner);
- recorded evidence (tests/fixtures: what real hosts said) and a run's own settings in an
  inventory (target_model, data_dir: the user's choice, not a default written again);
- ALLOWED below, each with its reason.
"""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from tests.conftest import ROOT
from tests.host_paths import HOST_PATHS, OWNER

# path, or folder ending in /, -> why it may spell a host path.
ALLOWED = {
    # The faults scenario is being changed alongside; its literals move to vars_files like the other scenarios'.
    "molecule/faults/": "pending: the faults scenario's own change",
    "tests/unit/test_host_paths.py": "this check's own examples",
}
DATA = (re.compile(r"^tests/fixtures/"), re.compile(r"^inventory/.+\.yml$"),
        re.compile(r"^molecule/[^/]+/(inventory/.+|host_vars/[^/]+)\.yml$"))
_LITERAL = re.compile("|".join(re.escape(p) + r"(?![A-Za-z0-9_-])"
                               for p in sorted(set(HOST_PATHS.values()), key=len, reverse=True)))
_COMMENTED = (".yml", ".yaml", ".py", ".sh", ".j2", ".cfg", ".toml", ".service", ".conf", "Makefile")


def _doc_lines(text: str) -> set[int]:
    """Line numbers of a Python file's docstrings and DOCUMENTATION/EXAMPLES/RETURN strings."""
    lines = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines |= set(range(body[0].lineno, body[0].end_lineno + 1))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN")
                                                for t in node.targets):
            lines |= set(range(node.lineno, node.end_lineno + 1))
    return lines


def spelled_outside(path: str, text: str) -> list[str]:
    """`path:line: text` for each host path this file spells where it should use the owner."""
    if path.endswith(".md") or any(path.startswith(a) if a.endswith("/") else path == a for a in ALLOWED) or any(d.match(path) for d in DATA) \
            or path in (OWNER.relative_to(ROOT).as_posix(), "roles/flashfleet_contract/meta/argument_specs.yml"):
        return []
    docs = _doc_lines(text) if path.endswith(".py") else set()
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _LITERAL.search(line)
        if not m or n in docs:
            continue
        if path.endswith(_COMMENTED) and "#" in line[:m.start()]:
            continue
        found.append(f"{path}:{n}: {line.strip()}")
    return found


def _tree() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted({p for p in out.splitlines() if (ROOT / p).is_file()})


def test_host_paths_are_spelled_only_by_their_owner():
    found = []
    for path in _tree():
        try:
            text = (ROOT / path).read_text()
        except UnicodeDecodeError:
            continue
        found += spelled_outside(path, text)
    assert found == [], "use the owner's variable (flashfleet_venv, ...) or tests/host_paths.py:\n" + "\n".join(found)


def test_the_allowed_files_still_need_it():
    """An allow-list entry whose file no longer spells a host path goes."""
    def spells(p: str) -> bool:
        files = [f for f in _tree() if f.startswith(p)] if p.endswith("/") else [p]
        return any((ROOT / f).exists() and _LITERAL.search((ROOT / f).read_text(errors="replace")) for f in files)
    stale = [p for p in ALLOWED if not spells(p)]
    assert stale == []


@pytest.mark.parametrize("path, text, expected", [
    ("roles/x/tasks/main.yml", "argv: [/opt/flashfleet/venv/bin/python]\n", 1),
    ("roles/x/tasks/main.yml", "argv: [\"{{ flashfleet_venv }}/bin/python\"]  # /opt/flashfleet/venv\n", 0),
    ("roles/x/library/m.py", '"""Runs /opt/flashfleet/venv/bin/python."""\nPY = "/opt/flashfleet/venv/bin/python"\n', 1),
    ("roles/x/library/m.py", 'EXAMPLES = r"""\nvenv: /opt/flashfleet/venv\n"""\n', 0),
    ("molecule/x/verify.yml", "dest: /var/lib/flashfleet/runs/a\n", 1),
    ("molecule/x/verify.yml", "dest: /opt/flashfleet/venv-other\n", 0),
    ("docs/x.md", "/opt/flashfleet/venv\n", 0),
])
def test_the_check_sees_a_new_literal(path, text, expected):
    assert len(spelled_outside(path, text)) == expected
