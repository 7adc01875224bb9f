"""The NVIDIA device nodes a GPU host (or an LXC guest of one) needs, and what their state means.

Inside an LXC guest the nodes come from its hypervisor: a node that is absent was never passed
through, a node the kernel refuses with EPERM was passed without its device-cgroup allow entry,
and a node that is allowed but answers ENXIO/ENODEV has no driver behind it (the host's module is
not loaded or is broken). Those three need different fixes on different machines, so the check
names which one it is, per GPU. Standard library only: shipped to hosts with the module that
calls it (roles/flashfleet_contract/library/flashfleet_gpu_devices.py).
"""

from __future__ import annotations

import errno
import os
import stat

# The driver's fixed nodes every CUDA process opens, beside /dev/nvidia<N> of each GPU it uses.
CONTROL_NODES = ("nvidiactl", "nvidia-uvm")

OK, MISSING, DENIED, NO_DRIVER, OTHER = "ok", "missing", "denied", "no-driver", "other"


def gpu_node(index: int) -> str:
    return f"nvidia{index}"


def probe(path: str) -> tuple[str, str]:
    """(state, detail) of one device node: opened and closed again, nothing read or written."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return MISSING, "absent"
    if not stat.S_ISCHR(st.st_mode):
        return OTHER, "not a character device"
    where = f"c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
    except OSError as e:
        if e.errno == errno.EPERM:
            return DENIED, where
        if e.errno in (errno.ENXIO, errno.ENODEV):
            return NO_DRIVER, where
        return OTHER, f"{where}: {os.strerror(e.errno)}"
    return OK, where


def check(gpus: list[int], dev: str = "/dev") -> list[dict]:
    """One row per node: the control nodes, then each GPU's."""
    rows = []
    for name, gpu in [(n, None) for n in CONTROL_NODES] + [(gpu_node(g), g) for g in gpus]:
        state, detail = probe(os.path.join(dev, name))
        rows.append({"node": os.path.join(dev, name), "gpu": gpu, "state": state, "detail": detail})
    return rows


def problem(row: dict, where: str, in_guest: bool) -> str | None:
    """One line naming what is wrong with a node and where to fix it; None when it opens."""
    what = f"GPU {row['gpu']} ({row['node']})" if row["gpu"] is not None else row["node"]
    host = "its hypervisor" if in_guest else "the host"
    passthrough_fix = (f"Fix: on {host}, map it to this guest and run provision.yml there (roles/proxmox_lxc_gpu "
                       "writes the guest's device entries and restarts it)")
    if row["state"] == MISSING:
        if in_guest:
            return (f"{where}: {what} is not in this guest: {host} has not passed it through. {passthrough_fix}.")
        return (f"{where}: {what} does not exist: the driver has not created it. Fix: load the driver "
                "(nvidia-modprobe -u -c=0, or modprobe nvidia nvidia-uvm) and check dmesg for NVRM lines.")
    if row["state"] == DENIED:
        return (f"{where}: {what} is here but the device cgroup denies it ({row['detail']} not allowed): "
                f"{host} passed the node without its allow entry. {passthrough_fix}.")
    if row["state"] == NO_DRIVER:
        return (f"{where}: {what} is passed through and allowed, but no driver answers for it ({row['detail']}): "
                f"the NVIDIA driver on {host} is not loaded or is broken. Fix: on {host}, run nvidia-smi and read "
                "dmesg for NVRM/Xid lines; reload the modules or reboot.")
    if row["state"] == OTHER:
        return f"{where}: {what} cannot be used: {row['detail']}. Fix: recreate it from the driver (nvidia-modprobe)."
    return None

