"""The python_env role's drift check: the lock rules (flashfleet.contract.locks, one rule set with
diagnose's evidence), flashfleet.envdrift against a real interpreter, and the module end to end
as Ansible runs it (the package shipped with it as ansible.module_utils.flashfleet)."""

from __future__ import annotations

import json
import sys

import flashfleet.envdrift as envdrift
import pytest
from flashfleet.contract import locks

from tests.conftest import ROOT, failure_messages


def test_parse_lock_normalizes_names_and_ignores_comments():
    pins = locks.parse("# header\n\nPydantic_Core==2.50.5   # via pydantic\ntorch==2.13.0+cpu\n")
    assert pins == {"pydantic-core": "2.50.5", "torch": "2.13.0+cpu"}


@pytest.mark.parametrize("text, needle", [
    ("wandb>=0.19\n", "line 1"),
    ("torch==2.13.0\nnot a pin\n", "line 2"),
    ("# only comments\n", "no pins"),
])
def test_parse_lock_rejects_what_is_not_a_lock(text, needle):
    with pytest.raises(ValueError, match=needle):
        locks.parse(text)


def test_compare_reports_changed_missing_and_extra_but_not_seed_tools():
    locked = {"wandb": "0.31.0", "pydantic": "2.14.4", "torch": "2.13.0+cpu"}
    installed = {"wandb": "0.27.0", "torch": "2.13.0+cpu", "pip": "23.2", "requests": "2.0", "flashfleet": "0.1.0"}
    result = locks.compare(locked, installed, ["pip", "setuptools", "wheel", "flashfleet"])
    assert result == [
        {"package": "pydantic", "locked": "2.14.4", "installed": None},
        {"package": "wandb", "locked": "0.31.0", "installed": "0.27.0"},
        {"package": "requests", "locked": None, "installed": "2.0"},
    ]
    table = locks.table(result).splitlines()
    assert table[0].split() == ["package", "locked", "installed"]
    assert table[2].split() == ["wandb", "0.31.0", "0.27.0"]
    assert "(missing)" in table[1] and "(not locked)" in table[3]


# ---------------------------------------------------------------- the rules pip has, that the old parser lacked


@pytest.mark.parametrize("locked, installed, same", [
    ("2.13.0", "2.13.0+cpu", True),  # a pin without a local label accepts any local build (pip does)
    ("2.13.0", "2.13.0+cu130", True),
    ("2.13.0", "2.13.0", True),
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("2.13.0+cpu", "2.13.0", False),  # a pin with a local label must match exactly
    ("2.13.0+cpu", "2.13.0+cu130", False),
    ("2.13.0", "2.13.1+cpu", False),
    ("2.13.0", None, False),
])
def test_versions_compare_per_pep_440_local_labels(locked, installed, same):
    assert locks.same_version(locked, installed) is same
    drift = locks.compare({"torch": locked}, {} if installed is None else {"torch": installed})
    assert (drift == []) is same


def test_option_lines_hashes_markers_and_continuations_are_a_lock():
    text = (
        "--index-url https://download.pytorch.org/whl/cpu\n"
        "--extra-index-url https://pypi.org/simple\n"
        "torch==2.13.0+cpu \\\n"
        "    --hash=sha256:aaaa \\\n"
        "    --hash=sha256:bbbb\n"
        "    # via flashfleet\n"
        "pywin32==306 ; sys_platform == 'win32'\n"
        "uvloop==0.21.0 ; python_version >= \"3.11\" --hash=sha256:cccc\n"
        "Requests[socks]==2.32.3\n"
        "zipp===3.21.0\n"
    )
    assert locks.parse(text) == {"torch": "2.13.0+cpu", "pywin32": "306", "uvloop": "0.21.0",
                                 "requests": "2.32.3", "zipp": "3.21.0"}


def test_a_bad_line_after_a_continuation_is_named_by_its_first_line():
    with pytest.raises(ValueError, match=r"line 2 is not a name==version pin: 'numpy>=2 \\\\'"):
        locks.parse("torch==2.13.0\nnumpy>=2 \\\n    --hash=sha256:aaaa\n")


def test_a_comment_starts_at_a_hash_after_any_whitespace_as_pip_reads_it():
    assert locks.parse("torch==2.13.0\t# via x\n  # indented\nnumpy==2.3.0 #x\n") == {"torch": "2.13.0",
                                                                                        "numpy": "2.3.0"}


def test_the_repository_locks_parse():
    for name in ("node-cpu.lock", "node-cuda.lock", "controller.lock"):
        pins = locks.parse((ROOT / "requirements" / name).read_text())
        assert "torch" in pins and "wandb" in pins, name


# ---------------------------------------------------------------- envdrift: the venv's own interpreter


def test_installed_distributions_reads_a_real_interpreter():
    """Against this very venv: torch is there at the version importlib.metadata reports."""
    import importlib.metadata

    found = envdrift.installed_distributions(sys.executable)
    assert found["torch"] == importlib.metadata.version("torch")
    assert locks.compare({"torch": found["torch"]}, found, list(found)) == []


def test_check_accepts_this_venv_against_its_own_pins_and_tables_drift():
    found = envdrift.installed_distributions(sys.executable)
    public = found["torch"].split("+", 1)[0]
    ok = envdrift.check(sys.executable, f"torch=={public}\n", ignore=list(found))
    assert ok["drift"] == [] and ok["table"] == "venv matches the lock" and ok["changed"] is False
    with pytest.raises(envdrift.DriftError, match="differs from the lock in 1 package") as err:
        envdrift.check(sys.executable, "torch==0.0.1\n", ignore=list(found), fail_on_drift=True)
    assert err.value.result["drift"] == [{"package": "torch", "locked": "0.0.1", "installed": found["torch"]}]
    with pytest.raises(envdrift.DriftError, match=r"lock x.lock: line 1 .*make lock"):
        envdrift.check(sys.executable, "torch>=2\n", "x.lock")
    with pytest.raises(envdrift.DriftError, match="cannot list the venv's packages with /nonexistent/python"):
        envdrift.check("/nonexistent/python", "torch==2.13.0\n")


def test_module_fails_with_a_table_on_drift(tmp_path, run_playbook):
    """The module end to end, as Ansible runs it: the package goes with it to the host."""
    lock = tmp_path / "x.lock"
    lock.write_text("torch==0.0.1\n")
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""
- hosts: all
  gather_facts: false
  tasks:
    - python_env_drift:
        python: {sys.executable}
        lock: {lock}
        fail_on_drift: true
        ignore: ["*"]
""")
    r = run_playbook(playbook, inventory, envvars={"ANSIBLE_LIBRARY": str(ROOT / "roles/python_env/library")})
    assert r.rc != 0
    (msg,) = failure_messages(r)
    assert "torch" in msg and "0.0.1" in msg and "provision.yml" in msg
    (failed,) = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_failed"]
    assert failed["drift"][0]["package"] == "torch" and failed["installed"]["torch"]
