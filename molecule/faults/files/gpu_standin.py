#!/usr/bin/python3
"""Stand-in GPU commands for a node without GPUs, answering from recorded outputs
(tests/fixtures/gpu_health, copied to REC/recorded by tasks/gpu_health.yml). Installed as
/usr/local/bin/nvidia-smi, dcgmi and journalctl (links to this file), it acts by the name it is run as:

    nvidia-smi -q                                   the recorded report (REC/now/nvidia-smi-q.txt)
    nvidia-smi --query-gpu=F,... --format=csv,...   those fields of each GPU, read from that report
    dcgmi diag ...                                  the recorded diagnostic (REC/now/dcgmi-diag.txt)
    journalctl -k ... [-o json|short-unix]          the recorded kernel log (REC/now/kernel-log.txt)
    journalctl (anything else)                      the node's own journalctl

and, run by its own name, changes what they answer:

    gpu_standin.py repair                        the cards as recorded (nvidia-smi, dcgmi); the kernel log keeps its lines
    gpu_standin.py fault NAME GPU                write a fault into GPU's outputs (FAULTS below)
    gpu_standin.py xid CODE PCI TEXT             append a driver Xid line for PCI, stamped now
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

REC = "/var/lib/ff-gpu-rec"
NOW = f"{REC}/now"
SMI, DCGM, KERNEL = "nvidia-smi-q.txt", "dcgmi-diag.txt", "kernel-log.txt"

# Each fault as a real output shows it (tests/fixtures/gpu_health/README.md cites where): a regex on
# the GPU's section of `nvidia-smi -q` and its replacement, or (dcgm) rows of a failed test.
FAULTS = {
    "row-remap-pending": (r"(Remapped Rows\n(?:.*\n){2}\s+Pending\s+: )No", r"\1Yes"),
    "x8-link": (r"(Link Width\n\s+Max\s+: 16x\n\s+Current\s+: )16x", r"\g<1>8x"),
    "thermal-throttle": (r"(HW Slowdown\s+: )Not Active\n(\s+HW Thermal Slowdown\s+: )Not Active",
                         r"\1Active\n\2Active"),
}
DCGM_FAIL = """+-----  Hardware  ----------+------------------------------------------------+
| memory                    | Fail                                           |
{rows}| Warning: GPU{gpu}             | Memory error detected on GPU {gpu}: DBE at 0x3f2a  |
|                           |  1000                                          |
+---------------------------+------------------------------------------------+
"""


def read(name: str) -> str:
    with open(os.path.join(NOW, name)) as f:
        return f.read()


def write(name: str, text: str) -> None:
    with open(os.path.join(NOW, name) + ".tmp", "w") as f:
        f.write(text)
    os.replace(os.path.join(NOW, name) + ".tmp", os.path.join(NOW, name))


def sections(report: str) -> list[str]:
    """The report's per-GPU sections, in order (nvidia-smi's index order)."""
    starts = [m.start() for m in re.finditer(r"^GPU ", report, re.M)] + [len(report)]
    return [report[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def field(section: str, label: str, under: str = "") -> str:
    if under:
        section = section[section.find(under):] if under in section else ""
    m = re.search(rf"^\s*{re.escape(label)}\s*: (.*)$", section, re.M)
    return m.group(1).strip() if m else "[N/A]"


def nvidia_smi(args: list[str]) -> int:
    report = read(SMI)
    if args[:1] == ["-q"]:
        sys.stdout.write(report)
        return 0
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    if query is None:
        print(f"nvidia-smi (stand-in): only -q and --query-gpu= are recorded, not {' '.join(args)}", file=sys.stderr)
        return 2
    nounits = any("nounits" in a for a in args if a.startswith("--format="))
    driver = field(report, "Driver Version")
    for index, s in enumerate(sections(report)):
        values = {"index": str(index), "name": field(s, "Product Name"), "uuid": field(s, "GPU UUID"),
                  "pci.bus_id": field(s, "Bus Id"), "driver_version": driver,
                  "memory.total": field(s, "Total", "FB Memory Usage"), "memory.used": field(s, "Used", "FB Memory Usage"),
                  "utilization.gpu": field(s, "Gpu", "Utilization"), "temperature.gpu": field(s, "GPU Current Temp"),
                  "pstate": field(s, "Performance State")}
        row = [values.get(f, "[N/A]") for f in query.split(",")]
        if nounits:
            row = [re.sub(r" (MiB|%|C)$", "", v) for v in row]
        print(", ".join(row))
    return 0


def journalctl(args: list[str]) -> int:
    if "-k" not in args and "--dmesg" not in args:
        os.execv("/usr/bin/journalctl", ["journalctl", *args])

    def opt(name, default=None):
        return args[args.index(name) + 1] if name in args[:-1] else default

    if opt("-b", "0") not in ("0", ""):
        print(f"Data from the specified boot ({opt('-b')}) is not available: No such boot ID in journal", file=sys.stderr)
        return 1
    since = opt("--since")
    entries = []
    for line in read(KERNEL).splitlines():
        m = re.match(r"^(\d+(?:\.\d+)?) (\S+) kernel: (.*)$", line)
        if m and (since is None or float(m.group(1)) >= float(since.lstrip("@"))):
            entries.append((m.group(1), m.group(2), m.group(3), line))
    if opt("-n"):
        entries = entries[-int(opt("-n")):]
    for ts, host, msg, line in entries:
        if opt("-o") == "json":
            print(json.dumps({"__REALTIME_TIMESTAMP": str(round(float(ts) * 1e6)), "_TRANSPORT": "kernel",
                              "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "4", "_HOSTNAME": host, "MESSAGE": msg}))
        else:
            print(line)
    return 0


def dcgmi(args: list[str]) -> int:
    sys.stdout.write(read(DCGM))
    return 0


def control(args: list[str]) -> int:
    if args[:1] == ["repair"]:
        os.makedirs(NOW, exist_ok=True)
        for name in (SMI, DCGM) + (() if os.path.exists(os.path.join(NOW, KERNEL)) else (KERNEL,)):
            shutil.copy(os.path.join(REC, "recorded", name), os.path.join(NOW, name))
        return 0
    if args[:1] == ["fault"] and len(args) == 3:
        name, gpu = args[1], int(args[2])
        if name == "dcgm-fail":  # a failed memory test after the recorded deployment rows, one row per GPU
            text = read(DCGM)
            rows = "".join(line.replace(f"GPU{gpu}: Pass", f"GPU{gpu}: Fail") + "\n"
                           for line in text.splitlines() if re.match(r"^\|\s+\| GPU\d+: Pass", line))
            write(DCGM, text[:text.rstrip().rfind("\n") + 1] + DCGM_FAIL.format(rows=rows, gpu=gpu))
            return 0
        report = read(SMI)
        parts = sections(report)
        head = report[:report.find(parts[0])]
        parts[gpu], n = re.subn(FAULTS[name][0], FAULTS[name][1], parts[gpu], count=1, flags=re.M)
        if n != 1:
            print(f"{name}: its field is not in GPU {gpu}'s section of the recording", file=sys.stderr)
            return 1
        write(SMI, head + "".join(parts))
        return 0
    if args[:1] == ["xid"] and len(args) == 4:
        code, pci, text = args[1:]
        with open(os.path.join(NOW, KERNEL), "a") as f:
            f.write(f"{time.time():.6f} {os.uname().nodename} kernel: NVRM: Xid (PCI:{pci}): {code}, "
                    f"pid='<unknown>', name=<unknown>, {text}\n")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    COMMANDS = {"nvidia-smi": nvidia_smi, "journalctl": journalctl, "dcgmi": dcgmi}
    sys.exit(COMMANDS.get(os.path.basename(sys.argv[0]), control)(sys.argv[1:]))
