"""The names inside a run's directory (status.json, metrics.jsonl, checkpoints/, run_config.json,
deaths/, ...) and a data directory's eval/prompts.jsonl have one owner, the contract
(module_utils/flashfleet/contract/layout.py, docs/contract.md). Code elsewhere uses the owner's
constants (`layout.CHECKPOINTS`) or, in YAML, its filter (`'layout.STATUS' | flashfleet_contract`).
This test fails when one of those names is spelled as a path anywhere else in the project's code:

- Python (trainer, kernels, module_utils, role modules and filters): a string that is such a name
  or a relative path ending in one, or a name used as a path part (`x / "checkpoints"`,
  os.path.join(..., "deaths"), Path("status.json")). Prose that mentions a file (a message, a help
  text, a docstring) is not a path and stays readable.
- YAML and templates (roles, playbooks, the entry points): a path part `/<name>` outside a comment.

deaths/<record>/evidence.json is the one name left out: diagnose.yml's own evidence.json on the
controller has the same name and is not the run directory's.
"""

from __future__ import annotations

import ast
import re
import subprocess

import pytest
from flashfleet.contract import layout

from tests.conftest import ROOT

NAMES = {getattr(layout, c) for c in ("STATUS", "METRICS", "CHECKPOINTS", "RUN_STATE", "RUN_CONFIG", "EVAL_PROMPTS",
                                      "DEATHS", "DEATH_VERDICT", "DEATH_WEBHOOK")}
# Names that are also ordinary words (an evidence key "checkpoints"): only their use as a path part counts.
_WORDS = {n for n in NAMES if "." not in n}
# The file of a name that is a relative path (eval/prompts.jsonl), when it is a path part.
_LAST = {n.rsplit("/", 1)[1] for n in NAMES if "/" in n}
_CALLS = {"join", "Path", "PurePath", "open", "glob", "rglob", "joinpath"}
_YAML_PATH = re.compile(r"/(" + "|".join(re.escape(n) for n in sorted(NAMES, key=len, reverse=True)) + r")(?![\w.-])")
PYTHON = re.compile(r"^(trainer|kernels|module_utils)/.+\.py$|^roles/[^/]+/(library|filter_plugins)/.+\.py$")
YAML = re.compile(r"^(roles|playbooks)/.+\.(ya?ml|j2)$|^[^/]+\.ya?ml$")
OWNER = re.compile(r"^module_utils/flashfleet/contract/")


def _is_name(value: str, words: bool) -> bool:
    """value is a contract name, or a relative path that ends in one or starts with a directory one."""
    if words and value in _LAST:
        return True
    for n in NAMES:
        if n in _WORDS and not words:
            continue
        if value == n or value.endswith("/" + n) or (n in _WORDS and value.startswith(n + "/")):
            return True
    return False


def python_literals(path: str, text: str) -> list[str]:
    tree = ast.parse(text)
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN")
                                                for t in node.targets):
            docs.add(id(node.value))
    path_parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            path_parts |= {id(node.left), id(node.right)}
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in _CALLS:
                path_parts |= {id(a) for a in node.args}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and _is_name(node.value, words=id(node) in path_parts):
            found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def yaml_literals(path: str, text: str) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line if path.endswith(".j2") else line.split(" #", 1)[0]
        if code.lstrip().startswith("#"):
            continue
        if _YAML_PATH.search(code):
            found.append(f"{path}:{n}: {line.strip()}")
    return found


def _files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.splitlines() if (ROOT / p).is_file() and not OWNER.match(p))


def test_contract_names_are_spelled_only_by_the_contract():
    found = []
    for path in _files():
        if PYTHON.match(path):
            found += python_literals(path, (ROOT / path).read_text())
        elif YAML.match(path):
            found += yaml_literals(path, (ROOT / path).read_text())
    assert found == [], "use flashfleet.contract.layout (YAML: the flashfleet_contract filter):\n" + "\n".join(found)


@pytest.mark.parametrize("text, expected", [
    ('ckpt = out / "checkpoints"\n', 1),
    ('p = os.path.join(run, "deaths", rec)\n', 1),
    ('p = run / "run_config.json"\n', 1),
    ('p = Path(data) / "eval" / "prompts.jsonl"\n', 1),
    ('PROMPTS = "eval/prompts.jsonl"\n', 1),
    ('open(d + "/status.json")\n', 1),
    ('ev["checkpoints"] = state\n', 0),
    ('msg = "no status.json yet"\n', 0),
    ('"""Reads <run>/status.json."""\n', 0),
    ('ckpt = out / layout.CHECKPOINTS\n', 0),
])
def test_the_python_check_sees_a_spelled_name(text, expected):
    assert len(python_literals("trainer/x.py", text)) == expected


@pytest.mark.parametrize("text, expected", [
    ('src: "{{ dir }}/status.json"\n', 1),
    ('dest: "{{ d }}/deaths/{{ r }}"\n', 1),
    ('- name: Fetch status.json\n', 0),
    ('# reads <dir>/checkpoints/\n', 0),
    ("src: \"{{ d }}/{{ 'layout.STATUS' | flashfleet_contract }}\"\n", 0),
])
def test_the_yaml_check_sees_a_spelled_name(text, expected):
    assert len(yaml_literals("roles/x/tasks/main.yml", text)) == expected
