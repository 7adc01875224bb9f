"""An LXC guest's GPU entries on its Proxmox VE host (flashfleet.pve_lxc, the proxmox_lxc_gpu role's
module) and the guest's per-node GPU check (flashfleet.gpu_devices): what is written, what is kept,
and which cause each failed open() is named as."""

from __future__ import annotations

import errno
import os

import flashfleet.gpu_devices as gpu_devices
import flashfleet.pve_lxc as pve_lxc
import pytest

# A GPU host's nodes: nvidia 195 (GPU N is minor N, nvidiactl 255), nvidia-uvm and nvidia-caps
# with dynamic majors.
NODES = [{"path": "/dev/nvidiactl", "major": 195, "minor": 255, "dir": False},
         {"path": "/dev/nvidia0", "major": 195, "minor": 0, "dir": False},
         {"path": "/dev/nvidia-uvm", "major": 508, "minor": 0, "dir": False},
         {"path": "/dev/nvidia-caps/nvidia-cap1", "major": 511, "minor": 1, "dir": False,
          "in_dir": "/dev/nvidia-caps"}]
MAJORS = {195, 508, 511}
CONF = """# training container
arch: amd64
hostname: ct200
memory: 2048
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /srv/data srv/data none bind,create=dir
dev0: /dev/dri/renderD128

[before-driver]
arch: amd64
lxc.cgroup2.devices.allow: c 195:* rwm
"""


def test_lxc_entries_are_exact_per_node_and_the_rest_is_kept_in_order():
    text, now, before = pve_lxc.rewrite(CONF, pve_lxc.entries(NODES, "lxc"), MAJORS, set())
    assert now == ["lxc.cgroup2.devices.allow: c 195:255 rwm", "lxc.cgroup2.devices.allow: c 195:0 rwm",
                   "lxc.cgroup2.devices.allow: c 508:0 rwm", "lxc.cgroup2.devices.allow: c 511:1 rwm",
                   "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
                   "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
                   "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
                   "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"]
    assert before == ["lxc.cgroup2.devices.allow: c 195:* rwm",
                      "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"]
    lines = text.splitlines()
    # The description, other keys, another device and the snapshot (untouched, after a blank line).
    assert lines[:5] == ["# training container", "arch: amd64", "hostname: ct200", "memory: 2048",
                         "lxc.mount.entry: /srv/data srv/data none bind,create=dir"]
    assert lines[5] == "dev0: /dev/dri/renderD128"
    assert lines[6:6 + len(now)] == now
    assert lines[6 + len(now):] == ["", "[before-driver]", "arch: amd64", "lxc.cgroup2.devices.allow: c 195:* rwm"]
    # Idempotent: the same nodes give the same text.
    again, now2, before2 = pve_lxc.rewrite(text, pve_lxc.entries(NODES, "lxc"), MAJORS, set(now))
    assert again == text and now2 == now and sorted(before2) == sorted(now)


def test_dev_entries_take_free_indexes_and_keep_other_devices():
    text, now, _ = pve_lxc.rewrite(CONF, pve_lxc.entries(NODES, "dev"), MAJORS, set())
    assert now == ["dev1: /dev/nvidiactl", "dev2: /dev/nvidia0", "dev3: /dev/nvidia-uvm",
                   "dev4: /dev/nvidia-caps/nvidia-cap1"]
    assert "dev0: /dev/dri/renderD128" in text.splitlines()
    # Switching to devN drops the raw lines it owned; switching back drops the devN lines.
    assert not [line for line in text.splitlines()[:12] if line.startswith("lxc.cgroup2")]
    back, _, before = pve_lxc.rewrite(text, pve_lxc.entries(NODES, "lxc"), MAJORS, set(now))
    assert sorted(before) == sorted(now) and "dev0: /dev/dri/renderD128" in back and "dev1:" not in back


def test_a_major_that_moved_leaves_no_stale_line():
    """nvidia-uvm's major is dynamic: after a driver change it may be 507. The old 508 line is the
    record's, so it goes although 508 is no longer an NVIDIA major."""
    moved = [dict(n, major=507) if n["path"] == "/dev/nvidia-uvm" else n for n in NODES]
    first, now, _ = pve_lxc.rewrite(CONF, pve_lxc.entries(NODES, "lxc"), MAJORS, set())
    second, _, _ = pve_lxc.rewrite(first, pve_lxc.entries(moved, "lxc"), {195, 507, 511}, set(now))
    assert "c 508:0" not in second and "c 507:0 rwm" in second
    kept_without_record, _, _ = pve_lxc.rewrite(first, pve_lxc.entries(moved, "lxc"), {195, 507, 511}, set())
    assert "c 508:0" in kept_without_record  # what the record is for


def test_host_nodes_reads_majors_and_names_missing_ones(tmp_path):
    os.mkfifo(tmp_path / "nvidiactl")  # not a character device
    with pytest.raises(pve_lxc.ConfigProblem, match="not a character device"):
        pve_lxc.host_nodes(str(tmp_path), [0])
    os.unlink(tmp_path / "nvidiactl")
    with pytest.raises(pve_lxc.ConfigProblem, match=r"no .*nvidiactl, .*nvidia0, .*nvidia-uvm.*nvidia-modprobe -u -c=0"):
        pve_lxc.host_nodes(str(tmp_path), [0])


@pytest.mark.parametrize("err, state", [(errno.EPERM, gpu_devices.DENIED), (errno.ENXIO, gpu_devices.NO_DRIVER),
                                        (errno.ENODEV, gpu_devices.NO_DRIVER), (errno.EIO, gpu_devices.OTHER)])
def test_each_open_error_is_its_own_cause(monkeypatch, err, state):
    monkeypatch.setattr(gpu_devices.os, "open", lambda *a: (_ for _ in ()).throw(OSError(err, os.strerror(err))))
    got, detail = gpu_devices.probe("/dev/null")
    assert got == state and detail.startswith("c 1:3")


def test_missing_and_openable_nodes(tmp_path):
    assert gpu_devices.probe(str(tmp_path / "nvidia0")) == (gpu_devices.MISSING, "absent")
    assert gpu_devices.probe("/dev/null")[0] == gpu_devices.OK
    rows = gpu_devices.check([0, 1], str(tmp_path))
    assert [r["node"].rsplit("/", 1)[1] for r in rows] == ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"]


def test_messages_tell_not_passed_through_from_a_broken_driver():
    def row(state, gpu=1, detail="c 195:1"):
        return {"node": f"/dev/nvidia{gpu}", "gpu": gpu, "state": state, "detail": detail}
    missing = gpu_devices.problem(row(gpu_devices.MISSING, detail="absent"), "ct200", in_guest=True)
    denied = gpu_devices.problem(row(gpu_devices.DENIED), "ct200", in_guest=True)
    broken = gpu_devices.problem(row(gpu_devices.NO_DRIVER), "ct200", in_guest=True)
    assert missing.startswith("ct200: GPU 1 (/dev/nvidia1) is not in this guest: its hypervisor has not passed it through")
    assert "device cgroup denies it (c 195:1 not allowed)" in denied and "proxmox_lxc_gpu" in denied
    assert "no driver answers" in broken and "not loaded or is broken" in broken and "has not passed" not in broken
    assert gpu_devices.problem(row(gpu_devices.OK), "ct200", in_guest=True) is None
    bare = gpu_devices.problem(row(gpu_devices.MISSING, detail="absent"), "ada1", in_guest=False)
    assert "has not created it" in bare and "guest" not in bare
