"""Bad input stops a role before it touches the host, with a message that names the problem.

Each case runs the real role against this machine through ansible-runner with the local
connection, in check mode as a second guard: every case must fail in validation, so nothing is
installed here. The last tests check the inputs every role gets from its flashfleet_contract
dependency (host paths, the contract's facts through its filters).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import ROOT, failure_messages


def _play(tmp_path, role: str, tasks_from: str = "main") -> tuple:
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""
- hosts: gpu_nodes
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: {role}
        tasks_from: {tasks_from}
""")
    return playbook, inventory


@pytest.mark.parametrize("role, extravars, needle", [
    ("python_env", {"python_env_profile": "gpu"}, "python_env_profile 'gpu' is unknown; known profiles: cpu, cuda"),
    ("python_env", {"python_env_profiles": {"cpu": 1}}, "python_env_profiles"),
    ("python_env", {"python_env_base_python": "/nonexistent/python3"}, "is missing or does not run"),
    ("python_env", {"python_env_min_python": "9.0"}, "the trainer needs Python >= 9.0"),
    ("build_toolchain", {"build_toolchain_python": "/nonexistent/python"}, "does not run"),
    ("build_toolchain", {"build_toolchain_packages": {"gcc": 1}}, "build_toolchain_packages"),
    ("local_node", {"local_node_containers": [{"name": "a", "ssh_port": 22}]}, "ssh ports >= 1024"),
    ("local_node", {"local_node_containers": [{"name": "a"}]}, "ssh_port"),
    ("proxmox_lxc_gpu", {"proxmox_lxc_gpu_guests": [{"name": "ct200", "ctid": "x", "gpus": [0]}]},
     'ct200: flashfleet_lxc_ctid "x" is not a container id'),
    ("proxmox_lxc_gpu", {"proxmox_lxc_gpu_guests": [{"name": "ct200", "ctid": 200, "gpus": [0, 5]}],
                         "proxmox_lxc_gpu_host_gpus": 2}, "flashfleet_lxc_gpus 0,5 names a GPU this host does not have"),
    ("proxmox_lxc_gpu", {"proxmox_lxc_gpu_guests": [{"name": "ct200", "ctid": 200, "gpus": []},
                                                    {"name": "ct201", "ctid": 200, "gpus": []}]},
     "ct201: CT 200 is also another guest's id"),
    ("proxmox_lxc_gpu", {"proxmox_lxc_gpu_guests": [{"name": "ct200", "ctid": 200, "gpus": []}]},
     "no `pct`: it is not a Proxmox VE host"),
])
def test_bad_input_fails_early_and_names_the_problem(tmp_path, run_playbook, role, extravars, needle):
    playbook, inventory = _play(tmp_path, role)
    extravars.setdefault("local_node_ssh_key", str(tmp_path / "key"))
    r = run_playbook(playbook, inventory, cmdline="--check", **extravars)
    assert r.rc != 0
    messages = "\n".join(failure_messages(r))
    assert needle in messages, messages
    changed = [ev for ev in r.events if ev.get("event") == "runner_on_ok" and ev["event_data"]["res"].get("changed")]
    assert changed == [], "validation must not change anything"


def test_a_lock_that_does_not_parse_stops_python_env(tmp_path, run_playbook):
    root = tmp_path / "project"
    (root / "requirements").mkdir(parents=True)
    (root / "requirements/node-cpu.lock").write_text("torch==2.13.0\nwandb>=0.19\n")
    playbook, inventory = _play(tmp_path, "python_env")
    r = run_playbook(playbook, inventory, cmdline="--check", python_env_project_root=str(root))
    messages = "\n".join(failure_messages(r))
    assert r.rc != 0
    assert "not a lock" in messages and "wandb>=0.19" in messages and "make lock" in messages


def test_the_repository_lock_passes_validation(tmp_path, run_playbook):
    """The same checks accept the real lock and this machine's Python (so the cases above fail for their reason)."""
    playbook, inventory = _play(tmp_path, "python_env", tasks_from="validate")
    r = run_playbook(playbook, inventory, cmdline="--check", python_env_base_python=sys.executable)
    assert r.rc == 0, "\n".join(failure_messages(r))
    assert (ROOT / "requirements/node-cpu.lock").exists()


def test_validation_reads_a_lock_by_the_contracts_rules(tmp_path, run_playbook):
    """Option lines, hashes, markers and continuations are a lock (the drift check reads them so);
    the message names the line that is not a pin."""
    root = tmp_path / "project"
    (root / "requirements").mkdir(parents=True)
    lock = root / "requirements/node-cpu.lock"
    lock.write_text("--index-url https://pypi.org/simple\ntorch==2.13.0+cpu \\\n    --hash=sha256:aa\n"
                    "pywin32==306 ; sys_platform == 'win32'\n")
    playbook, inventory = _play(tmp_path, "python_env", tasks_from="validate")
    r = run_playbook(playbook, inventory, cmdline="--check", python_env_project_root=str(root),
                     python_env_base_python=sys.executable)
    assert r.rc == 0, "\n".join(failure_messages(r))

    lock.write_text(lock.read_text() + "numpy>=2\n")
    r = run_playbook(playbook, inventory, cmdline="--check", python_env_project_root=str(root),
                     python_env_base_python=sys.executable)
    messages = "\n".join(failure_messages(r))
    assert r.rc != 0 and "line 5 is not a name==version pin: 'numpy>=2'" in messages, messages


def test_the_contract_role_gives_yaml_the_python_contracts_facts(tmp_path, run_playbook):
    """flashfleet_contract's filters read flashfleet.contract: the values YAML gets are the Python's."""
    from flashfleet.contract import layout, messages, status

    playbook, inventory = _play(tmp_path, "flashfleet_contract")
    playbook.write_text("""
- hosts: gpu_nodes
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: flashfleet_contract, public: true}
    - ansible.builtin.debug:
        msg:
          exit_config: "{{ 'messages.EX_CONFIG' | flashfleet_contract }}"
          pattern: "{{ 'messages.START_FAILURE_PATTERN' | flashfleet_contract }}"
          final: "{{ 'status.FINAL_PHASES' | flashfleet_contract }}"
          files: "{{ ['layout.STATUS', 'layout.METRICS'] | map('flashfleet_contract') }}"
          unit: "{{ 'v2' | flashfleet_unit_name }}"
          venv: "{{ flashfleet_venv }}"
    - ansible.builtin.debug:
        msg: "{{ 'messages.NOPE' | flashfleet_contract }}"
      ignore_errors: true
      register: unknown
""")
    r = run_playbook(playbook, inventory, flashfleet_venv="/srv/venv")
    assert r.rc == 0, "\n".join(failure_messages(r))
    oks = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_ok"
           and ev["event_data"]["task_action"] == "ansible.builtin.debug"]
    assert oks[0]["msg"] == {"exit_config": messages.EX_CONFIG, "pattern": messages.START_FAILURE_PATTERN,
                             "final": list(status.FINAL_PHASES), "files": [layout.STATUS, layout.METRICS],
                             "unit": "flashfleet-train@v2.service", "venv": "/srv/venv"}
    (failed,) = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_failed"]
    assert "'messages.NOPE' is not a constant of flashfleet.contract.messages" in failed["msg"]
    assert "EX_CONFIG" in failed["msg"]


def test_a_dependent_roles_defaults_follow_the_contracts_paths(tmp_path, run_playbook):
    """flashfleet_contract is a dependency of each role: its defaults reach the role's defaults, so
    one inventory variable moves a host path for every role."""
    playbook, inventory = _play(tmp_path, "train_unit")
    playbook.write_text("""
- hosts: gpu_nodes
  gather_facts: false
  roles:
    - {role: python_env, tags: [never]}
    - {role: train_unit, tags: [never]}
    - {role: dataset, tags: [never]}
    - {role: run_diagnosis, tags: [never]}
  tasks:
    - ansible.builtin.debug:
        msg: ["{{ python_env_dir }}", "{{ train_unit_venv }}", "{{ dataset_python }}", "{{ run_diagnosis_venv }}",
              "{{ train_unit_runs_root }}", "{{ run_diagnosis_output_dir }}", "{{ run_diagnosis_unit }}"]
      vars: {run_diagnosis_run: v2}
      tags: [show]
""")
    r = run_playbook(playbook, inventory, cmdline="--tags show --skip-tags always",
                     flashfleet_venv="/srv/venv", flashfleet_runs_root="/srv/runs")
    assert r.rc == 0, "\n".join(failure_messages(r))
    (ok,) = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_ok"]
    assert ok["msg"] == ["/srv/venv", "/srv/venv", "/srv/venv/bin/python", "/srv/venv", "/srv/runs",
                         "/srv/runs/v2", "flashfleet-train@v2.service"]


def _example_on_this_machine(**extravars) -> dict:
    """inventory/example's hosts reached with the local connection, without become (the checks only read)."""
    return {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
            "vault_s3_access_key": "k", "vault_s3_secret_key": "s", "vault_wandb_api_key": "w", **extravars}


def test_provision_refuses_the_examples_empty_checksum_before_any_host_changes(run_playbook):
    """provision.yml's preflight runs every role's checks on every host first: the example's empty
    NVIDIA checksums stop the play there, after the kernel role's checks passed on pve1 and before
    the kernel role (or any other) has done anything. --check is a second guard."""
    r = run_playbook(ROOT / "provision.yml", ROOT / "inventory/example", cmdline="--check", **_example_on_this_machine())
    assert r.rc != 0
    messages = "\n".join(failure_messages(r))
    assert "pve1: nvidia_driver_modules_sha256 is not a sha256" in messages, messages
    assert "ct200: nvidia_driver_runfile_sha256 is not a sha256" in messages, messages
    tasks = [ev["event_data"] for ev in r.events if ev.get("event", "").startswith("runner_on_")]
    assert {t["play"] for t in tasks} == {"Preflight every role's inputs on every host, before any role changes anything"}
    assert any(t["host"] == "pve1" and t["task"] == "Check the source settings" for t in tasks), "kernel checks ran first"
    assert [t for t in tasks if t.get("res", {}).get("changed")] == []


def test_provision_preflight_checks_every_role_with_checksums_given(run_playbook):
    """With the checksums set, the same preflight goes on to the CUDA, Python and dataset checks of
    the training hosts (ada1 has no NVIDIA driver here: cuda_toolkit_require_driver=false, as for an
    image build) and passes: every role is checked, nothing changed."""
    sha = "a" * 64
    r = run_playbook(ROOT / "provision.yml", ROOT / "inventory/example", cmdline="--check --tags preflight",
                     **_example_on_this_machine(nvidia_driver_modules_sha256=sha, nvidia_driver_runfile_sha256=sha,
                                                cuda_toolkit_key_sha256=sha, python_env_base_python=sys.executable,
                                                cuda_toolkit_require_driver=False))
    assert r.rc == 0, "\n".join(failure_messages(r))
    tasks = [ev["event_data"] for ev in r.events if ev.get("event", "").startswith("runner_on_")]
    checked = {(t["host"], t["role"]) for t in tasks if t.get("role") and t["task"].startswith(("Check", "Fail"))}
    assert {("pve1", "kernel"), ("pve1", "nvidia_driver"), ("pve1", "proxmox_lxc_gpu"), ("ct200", "nvidia_driver"),
            ("ct200", "cuda_toolkit"),
            ("ct200", "python_env"), ("ct200", "dataset"), ("ada1", "python_env")} <= checked, checked
    assert [t for t in tasks if t.get("res", {}).get("changed")] == []
