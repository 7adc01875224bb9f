"""RDMA and NCCL settings of a run's unit, rendered by the role's own templates through Ansible.

A play on this machine (local connection) loads the train_unit role's defaults and vars (tags
never: none of its tasks run) and renders its templates into a temporary directory: the template
unit, the run's drop-in and the run's environment file. The unit's device list is the template's
DeviceAllow lines plus the drop-in's (systemd adds them up), checked with and without rdma: true.
"""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, failure_messages, local_inventory, role_play

NVIDIA = {"char-nvidia-frontend rw", "char-nvidia-uvm rw", "char-nvidia-caps rw", "char-nvidia-nvswitch rw"}
RDMA = {"char-infiniband_verbs rw", "/dev/infiniband/rdma_cm rw"}


def _render(tmp_path, run_playbook, spec: dict, nccl_env: dict | None = None) -> dict[str, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    inventory = local_inventory(tmp_path)
    playbook = tmp_path / "render.yml"
    playbook.write_text(f"""
- hosts: all
  gather_facts: false
  roles:
    - {{role: train_unit, tags: [never]}}
  tasks:
    - ansible.builtin.template:
        src: "{ROOT}/roles/train_unit/templates/{{{{ item }}}}"
        dest: "{out}/{{{{ item | replace('.j2', '') }}}}"
        mode: "0600"
      loop: [flashfleet-train@.service.j2, run.conf.j2, run.env.j2]
      tags: [render]
""")
    extravars = {"train_unit_run": "v2", "train_unit_spec": spec}
    if nccl_env is not None:
        extravars["train_unit_nccl_env"] = nccl_env
    r = run_playbook(playbook, inventory, cmdline="--tags render --skip-tags always", **extravars)
    assert r.rc == 0, "\n".join(failure_messages(r)) + r.stdout.read()
    return {p.name: p.read_text() for p in out.iterdir()}


def _devices(files: dict[str, str]) -> set[str]:
    lines = (files["flashfleet-train@.service"] + files["run.conf"]).splitlines()
    return {line.split("=", 1)[1] for line in lines if line.startswith("DeviceAllow=")}


def test_without_rdma_the_unit_allows_the_nvidia_devices_only(tmp_path, run_playbook):
    files = _render(tmp_path, run_playbook, {"trainer": {}})
    assert "DevicePolicy=closed" in files["flashfleet-train@.service"]
    assert _devices(files) == NVIDIA
    assert "NCCL_" not in files["run.env"]


def test_with_rdma_the_unit_also_allows_the_infiniband_devices(tmp_path, run_playbook):
    files = _render(tmp_path, run_playbook, {"trainer": {}, "rdma": True})
    assert _devices(files) == NVIDIA | RDMA
    assert "[Service]" in files["run.conf"]


def test_the_hosts_nccl_settings_reach_the_environment_file_and_the_run_overrides_them(tmp_path, run_playbook):
    files = _render(tmp_path, run_playbook,
                    {"trainer": {}, "rdma": True, "nccl": {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "WARN"}},
                    nccl_env={"NCCL_SOCKET_IFNAME": "ens1f0", "NCCL_IB_HCA": "mlx5_0"})
    env = [line for line in files["run.env"].splitlines() if line.startswith("NCCL_")]
    assert env == ["NCCL_DEBUG=WARN", "NCCL_IB_HCA=mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME=ens1f0"]
    assert "WANDB_MODE=disabled" in files["run.env"]


@pytest.mark.parametrize("nccl, needle", [({"IB_HCA": "mlx5_0"}, "NCCL settings IB_HCA are not NCCL_* names"),
                                          ({"NCCL_IB_HCA": "mlx5_0\nLD_PRELOAD=/x"}, "NCCL settings NCCL_IB_HCA")])
def test_preflight_refuses_bad_nccl_settings(tmp_path, run_playbook, nccl, needle):
    r = run_playbook(role_play(tmp_path, "train_unit", "preflight"), local_inventory(tmp_path), cmdline="--check", train_unit_run="v2",
                     train_unit_spec={"trainer": {}, "nccl": nccl}, flashfleet_venv=str(tmp_path / "venv"))
    assert r.rc != 0
    assert any(needle in m for m in failure_messages(r)), failure_messages(r)
