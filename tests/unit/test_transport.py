"""--check says which transport the drafter ranks' collectives will use (issue: a multi-node run
that silently falls back to sockets). The RDMA side reads stand-in /sys/class/infiniband and
/dev/infiniband trees (files here; the real ones need an HCA); a verbs device that does not open
read-write, as under the unit's DevicePolicy=closed, is a file without permissions."""

import os

import pytest
from flashfleet_trainer.transport import hca_filter, nccl_transport


@pytest.fixture
def rdma(tmp_path):
    sys_ib, dev_ib = tmp_path / "sys", tmp_path / "dev"
    for h in ("mlx5_0", "mlx5_1", "mlx5_bond0"):
        (sys_ib / h).mkdir(parents=True)
    dev_ib.mkdir()
    (dev_ib / "uverbs0").write_bytes(b"")
    (dev_ib / "uverbs1").write_bytes(b"")
    return sys_ib, dev_ib


def line(env, rdma, nnodes=2, devices=("cuda:0", "cuda:1")):
    return nccl_transport(nnodes, list(devices), env, *rdma)


def test_single_rank_and_cpu_and_one_node(rdma):
    assert line({}, rdma, nnodes=1, devices=["cuda:0"]) == "collectives: none (one drafter rank)"
    assert "gloo over TCP (4 CPU drafter ranks)" in line({}, rdma, devices=["cpu", "cpu"])
    one = line({}, rdma, nnodes=1)
    assert "peer-to-peer over NVLink/PCIe" in one and "between nodes" not in one
    assert "shared memory (NCCL_P2P_DISABLE=1)" in line({"NCCL_P2P_DISABLE": "1"}, rdma, nnodes=1)


def test_multi_node_uses_verbs_when_an_hca_passes_the_filter_and_opens(rdma):
    got = line({}, rdma)
    assert "between nodes: InfiniBand/RoCE verbs over mlx5_0, mlx5_1, mlx5_bond0 (uverbs0, uverbs1)" in got
    assert "over mlx5_1 (" in line({"NCCL_IB_HCA": "=mlx5_1:1"}, rdma)
    assert "over mlx5_0, mlx5_bond0 (" in line({"NCCL_IB_HCA": "^mlx5_1"}, rdma)


def test_multi_node_falls_back_to_sockets_and_says_why(rdma, tmp_path):
    forced = line({"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ens1f0"}, rdma)
    assert forced.endswith("between nodes: sockets over NCCL_SOCKET_IFNAME=ens1f0 (NCCL_IB_DISABLE=1)")
    assert "(NCCL_NET=Socket)" in line({"NCCL_NET": "Socket"}, rdma)
    none = nccl_transport(2, ["cuda:0"], {}, tmp_path / "no-sys", rdma[1])
    assert "sockets over the interface NCCL picks (no RDMA device in" in none
    typo = line({"NCCL_IB_HCA": "mlx4_"}, rdma)
    assert "WARNING: NCCL_IB_HCA=mlx4_ matches none of the HCAs mlx5_0, mlx5_1, mlx5_bond0" in typo


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens a file whatever its mode")
def test_hidden_verbs_devices_say_set_rdma_true_unprivileged(rdma):
    for dev in rdma[1].iterdir():
        dev.chmod(0)
    assert "set `rdma: true` in the run" in line({}, rdma)


def test_no_verbs_devices_say_set_rdma_true(rdma):
    for dev in rdma[1].iterdir():
        dev.unlink()
    got = line({}, rdma)
    assert "WARNING: HCAs mlx5_0, mlx5_1, mlx5_bond0 are present but no verbs device opens here" in got
    assert "set `rdma: true` in the run" in got


def test_hca_filter_forms():
    hcas = ["mlx5_0", "mlx5_1", "mlx5_10"]
    assert hca_filter(None, hcas) == hcas
    assert hca_filter("mlx5_1", hcas) == ["mlx5_1", "mlx5_10"]  # a prefix
    assert hca_filter("=mlx5_1", hcas) == ["mlx5_1"]
    assert hca_filter("^=mlx5_1", hcas) == ["mlx5_0", "mlx5_10"]
    assert hca_filter("mlx5_0:1,mlx5_10:1", hcas) == ["mlx5_0", "mlx5_10"]


def test_check_prints_the_collectives_line(trainer_argv, capsys):
    from flashfleet_trainer.cli import main

    assert main([*trainer_argv(), "--check"]) == 0
    assert "collectives: none (one drafter rank)" in capsys.readouterr().out
