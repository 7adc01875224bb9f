"""The kernel log since boot: the NVRM Xid lines, by GPU, with what the Xid catalogue says to do.

The driver writes one `NVRM: Xid (PCI:<bus>): <code>, ...` line per event. Each is read with the
diagnosis's own pattern and catalogue (classify.signatures: RE_XID, XID_CATALOG, RECOVERY_ACTIONS;
their one owner is classify/catalogues/xid.py), so a Xid means the same before a launch as after a
death. The log comes from `journalctl -k -b 0 -o short-unix` (absolute times: a Xid before the GPU
was last cleared can be told apart), else from `dmesg` (seconds since boot, made absolute with the
boot time; its ring buffer may have lost the oldest lines, which the row then says).
"""

from __future__ import annotations

import re

from ..classify.signatures import RE_XID, RE_XID_154, RECOVERY_ACTIONS, XID_CATALOG
from .nvidia_smi import bus_key

JOURNAL_COMMAND = ["journalctl", "-k", "-b", "0", "-o", "short-unix", "--no-pager"]
DMESG_COMMAND = ["dmesg"]

_JOURNAL_TS = re.compile(r"^(?P<ts>\d+(?:\.\d+)?) ")
_DMESG_TS = re.compile(r"^\[\s*(?P<ts>\d+(?:\.\d+)?)\]")


def parse(text: str, fmt: str = "journal", boot_time: float | None = None) -> list[dict]:
    """Every Xid line of the log: {ts (epoch seconds or None), bus (bus_key), pci, code, action,
    kind, mnemonic, line}. fmt: "journal" (short-unix) or "dmesg" (seconds since boot_time)."""
    out = []
    for line in text.splitlines():
        m = RE_XID.search(line)
        if not m:
            continue
        ts = None
        t = (_JOURNAL_TS if fmt == "journal" else _DMESG_TS).search(line)
        if t and fmt == "journal":
            ts = float(t.group("ts"))
        elif t and boot_time is not None:
            ts = boot_time + float(t.group("ts"))
        code = int(m.group("code"))
        kind, _bucket, action, mnemonic = XID_CATALOG.get(code, ("unknown", None, "investigate", None))
        if code == 154:  # the driver names the recovery itself
            r = RE_XID_154.search(m.group("rest"))
            if r:
                action = RECOVERY_ACTIONS.get(int(r.group("code"), 16), "reset-gpu")
        out.append({"ts": ts, "bus": bus_key(m.group("pci")), "pci": m.group("pci"), "code": code, "action": action,
                    "kind": kind, "mnemonic": mnemonic, "line": line[m.start():].strip()})
    return out
