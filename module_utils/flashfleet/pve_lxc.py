"""A Proxmox VE container's NVIDIA device entries, written from the host's real device nodes.

/etc/pve/lxc/<ctid>.conf is `key: value` lines; `#` lines are the container's description;
a `[name]` line starts a snapshot section, which is left alone (entries go in the main section,
before it). Two ways to pass a device:

  lxc   raw LXC keys, any Proxmox VE: one `lxc.cgroup2.devices.allow: c MAJOR:MINOR rwm` per node
        (exact minors: a guest given GPU 0 cannot open GPU 1 even if it makes the node) and one
        `lxc.mount.entry: /dev/X dev/X none bind,optional,create=file` per node (a directory for
        /dev/nvidia-caps)
  dev   `devN: /dev/X` entries (Proxmox VE 8.2 and later): Proxmox itself creates the node and its
        cgroup rule at each start, from the node's current major

The majors come from stat() of the host's nodes: nvidia is 195, but nvidia-uvm and nvidia-caps get
dynamic majors that can change with a driver release, which is why nothing here is typed by hand.
The entries this owns are replaced whole: mount entries and devN entries of /dev/nvidia*, allow
lines of the current NVIDIA majors, and whatever it wrote the last time (the record), so a major
that moved leaves no stale line. Everything else in the file is kept as it was, in its order.
"""

from __future__ import annotations

import os
import re
import stat

ALLOW_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
_LINE = re.compile(r"^([A-Za-z0-9_.]+):\s*(.*)$")
_DEV_KEY = re.compile(r"^dev(\d+)$")
_ALLOW = re.compile(r"^[cb]\s+(\d+):")


class ConfigProblem(Exception):
    """A node or config the entries cannot be written from; its text is the one line to show."""


def host_nodes(dev: str, gpus: list[int]) -> list[dict]:
    """The nodes to pass, each {path, major, minor, dir}: nvidiactl, the GPUs, nvidia-uvm (and
    -tools when present), /dev/nvidia-caps/* when present. A required node missing is a problem."""
    nodes, missing = [], []
    required = ["nvidiactl"] + [f"nvidia{g}" for g in gpus] + ["nvidia-uvm"]
    for name in required + ["nvidia-uvm-tools"]:
        path = os.path.join(dev, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if name in required:
                missing.append(path)
            continue
        if not stat.S_ISCHR(st.st_mode):
            raise ConfigProblem(f"{path} is not a character device")
        nodes.append({"path": path, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev), "dir": False})
    if missing:
        raise ConfigProblem(
            f"the host has no {', '.join(missing)}: the driver has not created them (nvidia-uvm appears only once "
            "something loads it). Fix: check the GPUs are there (nvidia-smi) and run "
            "`nvidia-modprobe -u -c=0` (the role's flashfleet-nvidia-devices unit does at boot)")
    caps = os.path.join(dev, "nvidia-caps")
    if os.path.isdir(caps):
        for name in sorted(os.listdir(caps)):
            st = os.stat(os.path.join(caps, name))
            if stat.S_ISCHR(st.st_mode):
                nodes.append({"path": os.path.join(caps, name), "major": os.major(st.st_rdev),
                              "minor": os.minor(st.st_rdev), "dir": False, "in_dir": caps})
    return nodes


def entries(nodes: list[dict], style: str) -> list[tuple[str, str]]:
    """The (key, value) entries for the nodes. `dev` entries are numbered later (free indexes)."""
    if style == "dev":
        return [("dev", n["path"]) for n in nodes]
    out = [(ALLOW_KEYS[0], f"c {n['major']}:{n['minor']} rwm") for n in nodes]
    for n in nodes:
        if "in_dir" not in n:
            rel = n["path"].lstrip("/")
            out.append(("lxc.mount.entry", f"{n['path']} {rel} none bind,optional,create=file"))
    dirs = sorted({n["in_dir"] for n in nodes if "in_dir" in n})
    out += [("lxc.mount.entry", f"{d} {d.lstrip('/')} none bind,optional,create=dir") for d in dirs]
    return out


def _owned(key: str, value: str, majors: set[int], recorded: set[str]) -> bool:
    line = f"{key}: {value}"
    if line in recorded:
        return True
    if key == "lxc.mount.entry":
        return value.split()[0].startswith("/dev/nvidia") if value.split() else False
    if _DEV_KEY.match(key):
        return value.split(",")[0].removeprefix("path=").startswith("/dev/nvidia")
    if key in ALLOW_KEYS:
        m = _ALLOW.match(value)
        return bool(m) and int(m.group(1)) in majors
    return False


def rewrite(text: str, wanted: list[tuple[str, str]], majors: set[int], recorded: set[str]) -> tuple[str, list[str], list[str]]:
    """(new text, the entries' lines now, the owned lines found before): the main section keeps its
    other lines in order, loses the owned ones, and ends with the wanted entries."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    main, rest = lines[:end], lines[end:]
    kept, before = [], []
    for line in main:
        m = _LINE.match(line)
        if m and _owned(m.group(1), m.group(2).strip(), majors, recorded):
            before.append(f"{m.group(1)}: {m.group(2).strip()}")
        else:
            kept.append(line)
    used = {int(m.group(1)) for line in kept if (k := _LINE.match(line)) and (m := _DEV_KEY.match(k.group(1)))}
    free = (i for i in range(1000) if i not in used)
    now = [f"dev{next(free)}: {v}" if k == "dev" else f"{k}: {v}" for k, v in wanted]
    while kept and not kept[-1].strip():  # the entries follow the last line, with no blank between
        kept.pop()
    body = kept + now + ([""] if rest else []) + rest
    return "\n".join(body) + "\n", now, before
