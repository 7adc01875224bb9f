"""Which transport the drafter ranks' collectives will use, for `--check` to say before a start.

NCCL picks its transport itself at the first collective; by then a multi-node run that silently
fell back to sockets (RDMA devices hidden by the unit's device policy, an HCA filter that matches
nothing) has lost most of its bandwidth. This reads what NCCL reads, the same way:
- between nodes, InfiniBand/RoCE verbs when an HCA is listed under /sys/class/infiniband, passes
  NCCL_IB_HCA's filter, and a verbs device (/dev/infiniband/uverbs*) opens read-write from this
  process (the cgroup device policy is only seen by trying); NCCL_IB_DISABLE=1 or NCCL_NET=Socket
  force sockets; sockets go over NCCL_SOCKET_IFNAME (or NCCL's own choice);
- within a node, peer-to-peer over NVLink/PCIe unless NCCL_P2P_DISABLE=1 (then shared memory);
- CPU drafter ranks use gloo over TCP; one rank needs no collective at all.
"""

import os
from pathlib import Path

SYS_IB = Path("/sys/class/infiniband")
DEV_IB = Path("/dev/infiniband")


def hca_filter(spec: str | None, hcas: list[str]) -> list[str]:
    """The HCAs NCCL_IB_HCA keeps: `mlx5_0,mlx5_1` (prefixes), `=mlx5_0` (exact names), `^mlx5_2`
    (all but these); a `:port` suffix names a port of that HCA. Unset: every HCA."""
    if not spec:
        return hcas
    exclude, exact = spec.startswith("^"), False
    spec = spec.lstrip("^")
    if spec.startswith("="):
        exact, spec = True, spec[1:]
    names = [s.split(":")[0].strip() for s in spec.split(",") if s.strip()]

    def named(h):
        return any(h == n if exact else h.startswith(n) for n in names)

    return [h for h in hcas if named(h) != exclude]


def _verbs_open(dev_ib: Path) -> tuple[list[str], str | None]:
    """Verbs devices that open read-write here, and the first refusal (e.g. the unit's DevicePolicy)."""
    usable, refused = [], None
    for dev in sorted(dev_ib.glob("uverbs*")):
        try:
            os.close(os.open(dev, os.O_RDWR))
            usable.append(dev.name)
        except OSError as e:
            refused = refused or f"{dev}: {e.strerror}"
    return usable, refused


def nccl_transport(nnodes: int, drafter_devices: list[str], env=None, sys_ib: Path = SYS_IB,
                   dev_ib: Path = DEV_IB) -> str:
    """One summary line: the collectives' transport within and between nodes, and why."""
    env = os.environ if env is None else env
    ranks = nnodes * len(drafter_devices)
    if ranks == 1:
        return "collectives: none (one drafter rank)"
    if all(d == "cpu" for d in drafter_devices):
        return f"collectives: gloo over TCP ({ranks} CPU drafter ranks)"
    within = ("NCCL within a node: shared memory (NCCL_P2P_DISABLE=1)" if env.get("NCCL_P2P_DISABLE") == "1"
              else "NCCL within a node: peer-to-peer over NVLink/PCIe")
    if nnodes == 1:
        return f"collectives: {within}"
    ifname = env.get("NCCL_SOCKET_IFNAME")
    sockets = "sockets over " + (f"NCCL_SOCKET_IFNAME={ifname}" if ifname else "the interface NCCL picks")
    if env.get("NCCL_IB_DISABLE") == "1" or env.get("NCCL_NET", "").lower() == "socket":
        why = "NCCL_IB_DISABLE=1" if env.get("NCCL_IB_DISABLE") == "1" else "NCCL_NET=Socket"
        return f"collectives: {within}; between nodes: {sockets} ({why})"
    hcas = sorted(p.name for p in sys_ib.iterdir()) if sys_ib.is_dir() else []
    if not hcas:
        return f"collectives: {within}; between nodes: {sockets} (no RDMA device in {sys_ib})"
    kept = hca_filter(env.get("NCCL_IB_HCA"), hcas)
    if not kept:
        return (f"collectives: {within}; between nodes: {sockets}. WARNING: NCCL_IB_HCA={env.get('NCCL_IB_HCA')} "
                f"matches none of the HCAs {', '.join(hcas)}: fix NCCL_IB_HCA in the run's `nccl:` entry or the "
                "host's train_unit_nccl_env")
    usable, refused = _verbs_open(dev_ib)
    if not usable:
        return (f"collectives: {within}; between nodes: {sockets}. WARNING: HCAs {', '.join(kept)} are present but "
                f"no verbs device opens here ({refused or f'none in {dev_ib}'}): set `rdma: true` in the run "
                "so the unit allows /dev/infiniband")
    return f"collectives: {within}; between nodes: InfiniBand/RoCE verbs over {', '.join(kept)} ({', '.join(usable)})"
