"""A run with a `vllm:` entry, rendered by the roles' own templates through Ansible (no systemd here):
the trainer's configuration gets the servers' URLs, the run's drop-in Wants and starts After each
server unit, and each server's drop-in runs vLLM with the run's extraction settings (the trainer's
own `--serve-config` answer), the run's vLLM flags, its port and GPUs, and a real readiness probe.
"""

from __future__ import annotations

import json
import shlex

import pytest
from flashfleet.plan import run as plan
from flashfleet_trainer.vllm_target import serve_argv

from tests.conftest import ROOT, failure_messages, local_inventory
from tests.host_paths import HOST_PATHS

SPEC = {"trainer": {"target_model": f"{HOST_PATHS['flashfleet_model_shm_root']}/qwen3.6-27b",
                    "data_dir": f"{HOST_PATHS['flashfleet_data_root']}/d",
                    "drafter_gpus": "4,5,6,7"},
        "vllm": {"servers": [{"port": 8100, "gpus": "0,1"}, {"port": 8101, "gpus": "2,3"}],
                 "args": {"tensor-parallel-size": 2, "max-model-len": 8192, "enable-prefix-caching": False,
                          "enforce-eager": True},
                 "env": {"VLLM_LOGGING_LEVEL": "WARNING"}}}
SERVE = {"argv": serve_argv([1, 16, 31, 46, 61], 64), "layers": [2, 17, 32, 47, 62, 64]}


def _render(tmp_path, run_playbook, spec: dict) -> dict[str, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    playbook = tmp_path / "render.yml"
    playbook.write_text(f"""
- hosts: all
  gather_facts: false
  roles:
    - {{role: train_unit, tags: [never]}}
    - {{role: vllm_server, tags: [never]}}
  tasks:
    - ansible.builtin.copy:
        content: "{{{{ train_unit_trainer_config | to_nice_json }}}}"
        dest: "{out}/v2.json"
        mode: "0600"
      tags: [render]
    - ansible.builtin.template:
        src: "{ROOT}/roles/train_unit/templates/run.conf.j2"
        dest: "{out}/run.conf"
        mode: "0600"
      tags: [render]
    - ansible.builtin.template:
        src: "{ROOT}/roles/train_unit/templates/run.env.j2"
        dest: "{out}/run.env"
        mode: "0600"
      tags: [render]
    - ansible.builtin.template:
        src: "{ROOT}/roles/vllm_server/templates/flashfleet-vllm@.service.j2"
        dest: "{out}/flashfleet-vllm@.service"
        mode: "0600"
      tags: [render]
    - ansible.builtin.template:
        src: "{ROOT}/roles/vllm_server/templates/server.conf.j2"
        dest: "{out}/{{{{ item }}}}.conf"
        mode: "0600"
      vars:
        vllm_server_item: "{{{{ vllm_server_servers[vllm_server_index] }}}}"
        vllm_server_argv: "{{{{ ['python', '--port', vllm_server_item.port | string] + vllm_server_serve.argv
                               + vllm_server_item.flags }}}}"
      loop: "{{{{ vllm_server_units }}}}"
      loop_control:
        index_var: vllm_server_index
      tags: [render]
""")
    r = run_playbook(playbook, local_inventory(tmp_path), cmdline="--tags render --skip-tags always",
                     train_unit_run="v2", train_unit_spec=spec, vllm_server_run="v2", vllm_server_spec=spec,
                     vllm_server_serve=SERVE)
    assert r.rc == 0, "\n".join(failure_messages(r)) + r.stdout.read()
    return {p.name: p.read_text() for p in out.iterdir()}


def _directives(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def _systemd_words(line: str) -> list[str]:
    """An ExecStart= value as systemd splits it (double quotes, backslash escapes), %% and $$ undone."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


def test_the_trainer_asks_this_hosts_servers_and_its_unit_starts_after_them(tmp_path, run_playbook):
    files = _render(tmp_path, run_playbook, SPEC)
    config = json.loads(files["v2.json"])
    assert config["target_servers"] == "http://127.0.0.1:8100,http://127.0.0.1:8101"
    units = ["flashfleet-vllm@v2-0.service", "flashfleet-vllm@v2-1.service"]
    assert _directives(files["run.conf"], "Wants") == units == _directives(files["run.conf"], "After")


def test_each_server_runs_the_runs_extraction_on_its_own_port_and_gpus(tmp_path, run_playbook):
    files = _render(tmp_path, run_playbook, SPEC)
    for i, (port, gpus) in enumerate([(8100, "0,1"), (8101, "2,3")]):
        conf = files[f"flashfleet-vllm@v2-{i}.service.conf"]
        assert _directives(conf, "Environment")[0] == f"CUDA_VISIBLE_DEVICES={gpus}"
        argv = _systemd_words(_directives(conf, "ExecStart")[0])
        assert argv[:3] == ["python", "--port", str(port)]
        assert argv[3:3 + len(SERVE["argv"])] == SERVE["argv"]  # the JSON settings survive systemd's quoting
        assert argv[3 + len(SERVE["argv"]):] == ["--no-enable-prefix-caching", "--enforce-eager", "--max-model-len",
                                                  "8192", "--tensor-parallel-size", "2"]  # by name
        probe = _systemd_words(_directives(conf, "ExecStartPost")[0])
        assert probe[:3] == ["/usr/bin/env", "-u", "PYTHONPATH"]  # the trainer venv's package, not the connector's
        probe = probe[3:]
        assert probe[0].endswith("/bin/dflash-vllm-probe") and probe[1:] == [
            f"http://127.0.0.1:{port}", "--layers", "2,17,32,47,62,64"]
    unit = files["flashfleet-vllm@.service"]
    assert "KillMode=control-group" in unit and "Restart=always" in unit


def test_gpu_indices_mean_nvidia_smis_cards_to_the_trainer_and_every_server(tmp_path, run_playbook):
    # CUDA numbers GPUs fastest first unless told otherwise: on a host whose cards differ, the
    # trainer's cuda:N or a server's CUDA_VISIBLE_DEVICES=N would be another card than nvidia-smi's
    # GPU N, which the inventory, the health check and the quarantine name.
    files = _render(tmp_path, run_playbook, SPEC)
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in files["run.env"].splitlines()
    for i in range(2):
        env = _directives(files[f"flashfleet-vllm@v2-{i}.service.conf"], "Environment")
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env


def test_a_run_without_servers_gets_none(tmp_path, run_playbook):
    files = _render(tmp_path, run_playbook, {"trainer": SPEC["trainer"]})
    assert "target_servers" not in json.loads(files["v2.json"])
    assert "Wants=" not in files["run.conf"]


@pytest.mark.parametrize("args,flags", [
    ({"a-b": 2, "c": True, "d": False}, ["--a-b", "2", "--c", "--no-d"]),
    ({"compilation-config": {"level": 0}}, ["--compilation-config", '{"level":0}']),
])
def test_vllm_args_become_flags(args, flags):
    assert plan.vllm_flags(args) == flags
    with pytest.raises(plan.PlanError, match="without dashes"):
        plan.vllm_flags({"--tensor-parallel-size": 2})
