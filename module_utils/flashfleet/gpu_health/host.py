"""One health check of a host, as train.yml, gpu_check.yml and the command line run it: the
quarantine first (a run on a quarantined GPU is refused before anything else is measured), then
the checks, their evidence file, and the quarantine of each GPU that failed.

    check_host(runs_root, indices, ...) -> {"skipped"} | {"refused", "rows", "host", "ok", "lines",
                                           "evidence", "recorded", "cleared", "quarantined", "elapsed_s"}
"""

from __future__ import annotations

import json
import os
import time

from ..contract import quarantine
from ..contract.files import atomic_write_text
from . import checks, gather, nvidia_smi


def _evidence_path(runs_root: str, now: float) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return os.path.join(quarantine.health_dir(runs_root), f"{quarantine.CHECK_PREFIX}{stamp}.json")


def refusals(doc: dict, gpus: list[dict], indices: list[int] | None, clearing: str = "") -> list[str]:
    """One line per GPU of `indices` (None: all) that the quarantine holds, the one being cleared aside."""
    held = quarantine.quarantined(doc)
    return [f"GPU {g['index']} {quarantine.describe(held[g['uuid']])}" for g in gpus
            if (indices is None or g["index"] in indices) and g["uuid"] in held and g["uuid"] != clearing]


def check_host(runs_root: str | None, indices: list[int] | None, level: int = 1, budget_s: float = 120,
               probe_python: str | None = None, overrides: dict | None = None, record: bool = True,
               clear: str = "", cleared_by: str = "", raw: dict | None = None, now: float | None = None) -> dict:
    """The check of GPUs `indices` (None: every GPU). runs_root None: nothing read or written (no
    quarantine). clear: a quarantined GPU's UUID to release, only if it passes the check now (its
    Xids before now count as dealt with). raw: recorded outputs instead of running the commands."""
    t0, now = time.monotonic(), time.time() if now is None else now
    qpath = quarantine.path_for(runs_root) if runs_root else None
    doc = quarantine.read(qpath) if qpath else {"quarantined": {}, "cleared": []}
    clear = quarantine.normalize_uuid(clear) if clear else ""
    smi = raw if raw is not None else gather.gather_smi(budget_s)
    if smi.get("skipped"):
        return {"skipped": smi["skipped"], "ok": True, "lines": [f"GPU health: skipped: {smi['skipped']}"]}
    gpus = nvidia_smi.parse(smi["nvidia_smi"]["out"])["gpus"] if smi["nvidia_smi"].get("rc") == 0 else []
    if clear and clear not in {g["uuid"] for g in gpus}:
        raise ValueError(f"clear_quarantine={clear}: no such GPU on this host (its GPUs: "
                         f"{', '.join(g['uuid'] for g in gpus) or 'none'})")
    clear_index = [g["index"] for g in gpus if g["uuid"] == clear]
    if clear and indices is None:  # gpu_check.yml -e clear_quarantine=UUID: that GPU alone
        indices = clear_index
    refused = refusals(doc, gpus, indices, clear)
    if refused and not clear:
        return {"refused": refused, "ok": False, "rows": [], "host": [], "lines": refused,
                "quarantined": list(quarantine.quarantined(doc).values()), "elapsed_s": round(time.monotonic() - t0, 3)}
    if refused:  # the run's other quarantined GPUs still refuse it, after this one is checked and released
        indices = clear_index
    if raw is None:
        raw = gather.gather(indices, level, budget_s, probe_python, smi=smi)
    cleared = {g["uuid"]: quarantine.last_cleared(doc, g["uuid"]) for g in gpus}
    if clear:
        cleared[clear] = now
    result = checks.judge(raw, overrides, indices, cleared)
    result.update(refused=refused, recorded=[], cleared=None, evidence=None)
    if refused:
        result["ok"] = False
    if qpath:
        result["evidence"] = _evidence_path(runs_root, now)
        os.makedirs(os.path.dirname(result["evidence"]), mode=0o755, exist_ok=True)
        atomic_write_text(result["evidence"], json.dumps({"raw": raw, "result": result, "at": now}, indent=1) + "\n")
        for r in result["rows"]:
            if r["status"] == "fail" and record:
                why = "; ".join(t for _, lv, t in r["findings"] if lv == "fail")
                _entry, changed = quarantine.record(qpath, r["uuid"], f"health check: {why}", "gpu-check",
                                                    result["evidence"], pci=r["bus"], name=r["name"], now=now)
                result["recorded"].append(r["uuid"])
        row = next((r for r in result["rows"] if r["uuid"] == clear), None)
        if clear and row and row["status"] != "fail":
            result["cleared"] = quarantine.clear(qpath, clear, cleared_by or "gpu_health", now=now)
        result["quarantined"] = list(quarantine.quarantined(quarantine.read(qpath)).values())
    result["elapsed_s"] = round(time.monotonic() - t0, 3)
    result["lines"] = refused + checks.table(result)
    return result
