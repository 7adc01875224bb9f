"""The lock parser and drift comparison of roles/python_env/library/python_env_drift.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, load_file

drift = load_file(ROOT / "roles/python_env/library/python_env_drift.py")


def test_parse_lock_normalizes_names_and_ignores_comments():
    pins = drift.parse_lock("# header\n\nPydantic_Core==2.50.5   # via pydantic\ntorch==2.13.0+cpu\n")
    assert pins == {"pydantic-core": "2.50.5", "torch": "2.13.0+cpu"}


@pytest.mark.parametrize("text, needle", [
    ("wandb>=0.19\n", "line 1"),
    ("torch==2.13.0\nnot a pin\n", "line 2"),
    ("# only comments\n", "no pins"),
])
def test_parse_lock_rejects_what_is_not_a_lock(text, needle):
    with pytest.raises(ValueError, match=needle):
        drift.parse_lock(text)


def test_compare_reports_changed_missing_and_extra_but_not_seed_tools():
    locked = {"wandb": "0.31.0", "pydantic": "2.14.4", "torch": "2.13.0+cpu"}
    installed = {"wandb": "0.27.0", "torch": "2.13.0+cpu", "pip": "23.2", "requests": "2.0", "flashfleet": "0.1.0"}
    result = drift.compare(locked, installed, ["pip", "setuptools", "wheel", "flashfleet"])
    assert result == [
        {"package": "pydantic", "locked": "2.14.4", "installed": None},
        {"package": "wandb", "locked": "0.31.0", "installed": "0.27.0"},
        {"package": "requests", "locked": None, "installed": "2.0"},
    ]
    table = drift.format_table(result).splitlines()
    assert table[0].split() == ["package", "locked", "installed"]
    assert table[2].split() == ["wandb", "0.31.0", "0.27.0"]
    assert "(missing)" in table[1] and "(not locked)" in table[3]


def test_installed_distributions_reads_a_real_interpreter():
    """Against this very venv: torch is there at the version importlib.metadata reports."""
    import importlib.metadata

    found = drift.installed_distributions(sys.executable)
    assert found["torch"] == importlib.metadata.version("torch")
    assert drift.compare({"torch": found["torch"]}, found, list(found)) == []


def test_module_fails_with_a_table_on_drift(tmp_path):
    """The module end to end, as Ansible runs it: JSON args in, JSON result out."""
    import json

    lock = tmp_path / "x.lock"
    lock.write_text("torch==0.0.1\n")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "python": sys.executable, "lock": str(lock), "fail_on_drift": True, "ignore": ["*"]}}))
    out = subprocess.run([sys.executable, str(ROOT / "roles/python_env/library/python_env_drift.py"), str(args)],
                         capture_output=True, text=True)
    result = json.loads(out.stdout)
    assert result["failed"] is True
    assert "torch" in result["msg"] and "0.0.1" in result["msg"] and "provision.yml" in result["msg"]
