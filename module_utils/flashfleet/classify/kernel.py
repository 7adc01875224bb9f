"""Reader of the kernel log and the cgroups (evidence.py's gather_kernel and gather_cgroup): OOM
kills, Xids, NVRM and other kernel findings, user-space crash lines; which memory cgroup is this
host's."""

from __future__ import annotations

import re

from . import catalogues
from .journal import fmt_time, message, realtime
from .signatures import (
    HOST_SIGNATURES,
    KERNEL_AFTER_EXIT_S,
    KERNEL_BEFORE_START_S,
    KERNEL_SIGNATURES,
    RE_API_MISMATCH,
    RE_OOM_KILL,
    RE_OOM_KILLED,
    RE_SEGFAULT,
    RE_TRAP,
    RE_XID,
    RE_XID_154,
    RE_XID_CAUSED_BY,
    RE_XID_NAME,
    RE_XID_PID,
    RECOVERY_ACTIONS,
    XID_CATALOG,
)


def kernel_events(evidence: dict, start: float | None, end: float | None) -> tuple[list[dict], list[dict]]:
    """OOM kills and Xid lines of the kernel log inside [start, end] (bounds widened a little)."""
    scan = kernel_scan(evidence, start, end)
    return scan["ooms"], scan["xids"]


def kernel_scan(evidence: dict, start: float | None, end: float | None) -> dict:
    """Everything of interest in the kernel log inside [start, end] (bounds widened a little): OOM
    kills, every Xid (in order), the other host findings (`nvrm`: NVRM's API mismatch, an adapter that
    did not initialise; KERNEL_SIGNATURES: a failing filesystem, a PCIe AER failure) and user-space
    crash lines (segfault, trap) naming the faulting library, and the kernel catalogue's families
    (`families`: machine checks, hung tasks, lockups, NFS, the kernel's own faults); `texts`: every
    line of the window, for a failure no rule knows."""
    kernel = evidence.get("kernel") or {}
    lo = start - KERNEL_BEFORE_START_S if start is not None else None
    hi = end + KERNEL_AFTER_EXIT_S if end is not None else None
    ooms: dict[str, dict] = {}
    xids: list[dict] = []
    faults: list[dict] = []
    texts: list[tuple[float | None, str]] = []
    for entry in kernel.get("entries") or []:
        ts = realtime(entry)
        if ts is not None and ((lo is not None and ts < lo) or (hi is not None and ts > hi)):
            continue
        text = message(entry)
        texts.append((ts, text))
        m = RE_OOM_KILL.search(text)
        if m:
            oom = ooms.setdefault(m.group("pid"), {"pid": m.group("pid"), "lines": []})
            oom.update(constraint=m.group("constraint"), task_memcg=m.group("task_memcg"),
                       oom_memcg=m.group("oom_memcg"), comm=m.group("task"), ts=ts)
            oom["lines"].append(kline(ts, text))
            continue
        m = RE_OOM_KILLED.search(text)
        if m:
            oom = ooms.setdefault(m.group("pid"), {"pid": m.group("pid"), "lines": []})
            oom.setdefault("ts", ts)
            oom.setdefault("comm", m.group("comm"))
            oom["memcg_kill"] = m.group("kind").startswith("Memory cgroup")
            oom["lines"].append(kline(ts, text))
            continue
        m = RE_XID.search(text)
        if m:
            xids.append(_xid(m, ts, text))
            continue
        m = RE_SEGFAULT.search(text) or RE_TRAP.search(text)
        if m:
            what = m.groupdict().get("what") or f"segfault at {m.group('addr')}"
            faults.append({"comm": m.group("comm"), "pid": m.group("pid"), "lib": m.group("lib"), "what": what.strip(),
                           "ts": ts, "line": kline(ts, text)})
    # NVRM findings: one printk can span lines (`NVRM: ...` continuations, or `#012` in syslog).
    nvrm = []
    joined = "\n".join(text for _, text in texts)
    m = RE_API_MISMATCH.search(joined)
    if m:
        ts = next((t for t, text in texts if "API mismatch" in text), None)
        nvrm.append({"kind": "driver-mismatch", "action": "fix-driver", "ts": ts, "source": "kernel",
                     "text": re.sub(r"\s*(?:\n|#012)\s*", " ", m.group(0)),
                     "line": kline(ts, "NVRM: " + re.sub(r"\s*(?:\n|#012)\s*", " ", m.group(0))),
                     "what": f"NVRM: API mismatch: the client{' ' + repr(m.group('client')) if m.group('client') else ''} "
                             f"has {m.group('client_version')}, the kernel module {m.group('module_version')}: "
                             f"reboot (or reload the nvidia modules) so that module and libraries match"})
    for ts, text in texts:
        nvidia = "NVRM" in text or "nvidia" in text.lower()
        for kind, rx, action, what in (HOST_SIGNATURES if nvidia else ()) + KERNEL_SIGNATURES:
            if kind != "driver-mismatch" and rx.search(text):
                nvrm.append({"kind": kind, "action": action, "ts": ts, "line": kline(ts, text), "what": what,
                             "source": "kernel", "text": text.strip()})
                break
    # the kernel's other families (catalogues/kernel.py): machine checks, hung tasks, lockups, NFS, Oops
    families = []
    for ts, text in texts:
        entry = catalogues.lookup(text, "kernel")
        if entry is not None and entry.layer == "kernel":
            families.append({"entry": entry, "ts": ts, "line": kline(ts, text), "text": text.strip()})
            if entry.verdict == "filesystem-error" and not any(h["text"] == text.strip() for h in nvrm):
                nvrm.append({"kind": entry.verdict, "action": entry.action, "ts": ts, "line": kline(ts, text),
                             "what": entry.meaning, "source": "kernel", "text": text.strip()})
    return {"ooms": list(ooms.values()), "xids": xids, "nvrm": nvrm, "faults": faults, "families": families,
            "texts": texts}


def _xid(m: re.Match, ts: float | None, text: str) -> dict:
    rest = m.group("rest")
    pid = RE_XID_PID.search(rest)
    name = RE_XID_NAME.search(rest)
    code = int(m.group("code"))
    kind, bucket, action, mnemonic = XID_CATALOG.get(code, ("unknown", None, "investigate", None))
    x = {"code": code, "pci": m.group("pci"), "ts": ts,
         "pid": pid.group("pid") if pid and pid.group("pid").isdigit() else None,
         "name": name.group("name").strip() if name else None, "kind": kind, "bucket": bucket,
         "action": action, "mnemonic": mnemonic, "hardware": kind in ("hardware", "recovery"),
         "application": kind == "application", "line": kline(ts, text)}
    if code == 154:
        r = RE_XID_154.search(rest)
        if r:
            x["action"] = RECOVERY_ACTIONS.get(int(r.group("code"), 16), "reset-gpu")
            x["recovery"] = r.group("name") or f"0x{r.group('code')}"
    caused = RE_XID_CAUSED_BY.search(rest)
    if caused:  # e.g. `45, ... caused by previous Xid 149`: a follow-on naming its root
        x["caused_by"] = int(caused.group("code"))
    return x


def kline(ts: float | None, text: str) -> str:
    return f"kernel {fmt_time(ts)}: {text.strip()}"



def host_memcg(evidence: dict) -> str | None:
    """The memory cgroup this host (a container, say) lives in, from PID 1's /proc/1/cgroup; None
    when that is the root (a real host) or unknown: then nothing can be excluded by it."""
    own = (evidence.get("cgroup") or {}).get("own") or []
    path = None
    for line in own:
        parts = str(line).split(":", 2)
        if len(parts) == 3 and ("memory" in parts[1].split(",") or (parts[0] == "0" and parts[1] == "" and path is None)):
            path = parts[2]
            if "memory" in parts[1].split(","):
                break
    if path is None:
        return None
    path = path.removesuffix("/init.scope").rstrip("/")
    return path or None


def memcg_in_host(memcg: str | None, host_cg: str | None) -> bool:
    """False when the kernel line's cgroup is provably another container's (a shared kernel)."""
    if not memcg or not host_cg:
        return True
    return memcg == host_cg or memcg.startswith(host_cg + "/")


def memcg_names_other_unit(memcg: str | None, unit_names: set[str]) -> bool:
    if not memcg:
        return False
    leaf = memcg.rstrip("/").rsplit("/", 1)[-1]
    return leaf.endswith((".service", ".scope")) and not any(u in memcg for u in unit_names)



def kernel_reason(evidence: dict) -> str:
    return str((evidence.get("kernel") or {}).get("error") or "not readable")

