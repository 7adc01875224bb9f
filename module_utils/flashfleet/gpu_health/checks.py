"""The per-GPU checks, in order, and the rows they make.

Each check is a small pure function `check(cfg, gpu) -> (level, text)` of the settings (settings.py)
and one GPU's parsed facts: gpu["smi"] (nvidia_smi.facts), gpu["xids"] (xid.parse, this GPU's,
after it was last cleared), gpu["dcgm"] (None: not run; {"error": ...}; or {"failures": [...]}),
gpu["matmul"] ((level, text) from probe.matmul_findings, or None). level: "ok", "warn", "fail",
"skip". A row's status is its worst level; a "fail" quarantines the GPU and refuses the run.
"""

from __future__ import annotations

from . import dcgm as dcgm_source
from . import nvidia_smi, probe, xid
from .settings import resolve

ORDER = {"ok": 0, "skip": 0, "warn": 1, "fail": 2}


def _level(setting: str, problem: bool) -> str:
    return ("skip" if setting == "off" else setting) if problem else "ok"


def check_ecc(cfg, gpu):
    n = gpu["smi"]["ecc_uncorrectable"]
    if n is None:
        return "skip", "ECC: volatile counters not reported (ECC off, or not this card)"
    if n > cfg["ecc_uncorrectable_max"]:
        return "fail", (f"ECC: {n} volatile uncorrectable error(s) since the driver loaded (ecc_uncorrectable_max "
                        f"{cfg['ecc_uncorrectable_max']:g}); reset the GPU (nvidia-smi -r) and run the check again")
    return "ok", "ECC: no volatile uncorrectable errors"


def check_row_remap(cfg, gpu):
    smi = gpu["smi"]
    if smi["remap_failure"]:
        return (_level(cfg["row_remap_failure"], True),
                "row remapping: a remapping failure occurred (no spare rows left); drain the GPU, RMA")
    if smi["remap_pending"] or smi["retired_pending"]:
        what = "a row remap" if smi["remap_pending"] else "a page retirement"
        return (_level(cfg["row_remap_pending"], True),
                f"row remapping: {what} is pending until the GPU is reset; reset it (nvidia-smi -r, or reboot), "
                "then clear it")
    if smi["remap_pending"] is None and smi["retired_pending"] is None:
        return "skip", "row remapping: not reported"
    return "ok", "row remapping: nothing pending"


def check_throttle(cfg, gpu):
    t = gpu["smi"]["throttle"]
    hw = [n for n in ("hw_slowdown", "hw_thermal", "hw_power_brake") if t.get(n)]
    if hw:
        return (_level(cfg["throttle_hw"], True),
                f"clocks: {', '.join(hw)} active (the hardware halves the clocks or more; temperature "
                f"{gpu['smi']['temperature_c']} C); check cooling and power")
    if t.get("sw_thermal"):
        return _level(cfg["throttle_sw_thermal"], True), f"clocks: sw_thermal slowdown at {gpu['smi']['temperature_c']} C"
    if all(v is None for v in t.values()):
        return "skip", "clocks: event reasons not reported"
    return "ok", "clocks: no slowdown"


def check_pcie(cfg, gpu):
    p = gpu["smi"]["pcie"]
    if p["width_current"] is not None and p["width_max"] and p["width_current"] < p["width_max"]:
        return (_level(cfg["pcie_width"], True),
                f"PCIe: link x{p['width_current']} of the card's x{p['width_max']}; reseat the card or its riser")
    if p["gen_max"] and p["gen_device_max"] and p["gen_max"] < p["gen_device_max"]:
        return (_level(cfg["pcie_gen"], True),
                f"PCIe: link at most gen {p['gen_max']} (host {p['gen_host_max']}), the card does gen "
                f"{p['gen_device_max']}")
    if p["width_current"] is None:
        return "skip", "PCIe: link not reported"
    return "ok", f"PCIe: gen {p['gen_max'] or '?'} x{p['width_current']}"


def check_persistence(cfg, gpu):
    if gpu["smi"]["persistence"] is False:
        return _level(cfg["persistence_mode"], True), "persistence mode off (nvidia-smi -pm 1, or nvidia-persistenced)"
    return "ok", "persistence mode on"


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(v).split(".") if x.isdigit())


def check_driver(cfg, gpu):
    have = gpu["smi"]["driver"]
    if cfg["driver_min"] and (not have or _version(have) < _version(cfg["driver_min"])):
        return "fail", f"driver {have} is older than driver_min {cfg['driver_min']}; upgrade it (provision.yml)"
    return "ok", f"driver {have}"


def check_xid(cfg, gpu):
    xids = gpu["xids"]
    bad = [x for x in xids if x["action"] in cfg["xid_actions"]]
    if bad:
        x = bad[-1]
        return "fail", (f"Xid: {len(bad)} since boot needing {x['action']}, the last Xid {x['code']} "
                        f"({x['mnemonic']}): {x['line']}")
    if xids:
        return "warn", f"Xid: {len(xids)} since boot, none needing a GPU action (last Xid {xids[-1]['code']})"
    return "ok", "Xid: none since boot"


def check_dcgm(cfg, gpu):
    d = gpu["dcgm"]
    if d is None:
        return "skip", "DCGM: not installed (the dcgm role installs it)"
    if d.get("error"):
        return "warn", f"DCGM: could not run the diagnostic: {d['error']}"
    if d["failures"]:
        return _level(cfg["dcgm"], True), f"DCGM level {d['level']}: " + "; ".join(d["failures"])
    return "ok", f"DCGM level {d['level']}: pass"


def check_matmul(cfg, gpu):
    return gpu["matmul"] or ("skip", "matmul: not measured")


CHECKS = (check_ecc, check_row_remap, check_throttle, check_pcie, check_persistence, check_driver, check_xid,
          check_dcgm, check_matmul)


def judge(raw: dict, overrides: dict | None = None, indices: list[int] | None = None,
          cleared: dict | None = None) -> dict:
    """The rows of the GPUs `indices` (None: all) from the gathered outputs (gather.gather's or a
    recorded directory's): {"rows": [{index, uuid, bus, name, status, findings: [(check, level,
    text)]}], "host": [(check, level, text)], "ok": bool}. cleared: {uuid: epoch seconds} of each
    GPU's last clear (its older Xids are left out)."""
    cfg = resolve(overrides)
    smi = nvidia_smi.parse(raw["nvidia_smi"]["out"]) if raw["nvidia_smi"].get("rc") == 0 else None
    if smi is None:
        err = (raw["nvidia_smi"].get("err") or raw["nvidia_smi"].get("out") or "").strip()[:300]
        return {"rows": [], "host": [("nvidia-smi", "fail", f"nvidia-smi -q failed: {err}")], "ok": False}
    gpus = [g for g in smi["gpus"] if indices is None or g["index"] in indices]
    host = []
    missing = sorted(set(indices or []) - {g["index"] for g in smi["gpus"]})
    if missing:
        host.append(("nvidia-smi", "fail", f"GPU(s) {missing} not in nvidia-smi's report ({len(smi['gpus'])} GPU(s))"))
    k = raw.get("kernel") or {}
    xids = xid.parse(k.get("out", ""), k.get("fmt", "journal"), k.get("boot_time")) if k.get("rc") == 0 else None
    if xids is None:
        host.append(("xid", "warn", f"kernel log not read ({(k.get('err') or 'no reader').strip()[:200]}): Xids unchecked"))
    d = raw.get("dcgm")
    parsed = dcgm_source.parse(d["out"] + d.get("err", "")) if d else None
    dcgm_fail = dcgm_source.failures(parsed, [g["index"] for g in gpus]) if parsed and parsed["ran"] else {}
    pr = raw.get("probe") or {}
    measured = pr.get("result") or {}
    matmul = probe.matmul_findings(cfg, measured.get("gpus", [])) if measured.get("gpus") else {}
    rows = []
    for g in gpus:
        since = (cleared or {}).get(g["uuid"])
        mine = [x for x in xids or [] if x["bus"] == nvidia_smi.bus_key(g["bus"])
                and not (since and x["ts"] is not None and x["ts"] <= since)]
        facts = {"smi": g, "xids": mine,
                 "dcgm": None if not d else ({"error": parsed["error"]} if not parsed["ran"] else
                                             {"level": d["level"], "failures": dcgm_fail.get(g["index"], [])}),
                 "matmul": matmul.get(g["uuid"]) or (("skip", f"matmul: {measured.get('skipped') or pr.get('skipped')}")
                                                     if (measured.get("skipped") or pr.get("skipped")) else None)}
        findings = [(c.__name__[len("check_"):], *c(cfg, facts)) for c in CHECKS]
        status = max((f[1] for f in findings), key=lambda lv: ORDER[lv])
        rows.append({"index": g["index"], "uuid": g["uuid"], "bus": g["bus"], "name": g["name"],
                     "status": "ok" if status == "skip" else status, "findings": findings})
    if pr:
        ar = measured.get("allreduce") or {"skipped": measured.get("skipped") or pr.get("skipped") or "not run"}
        host.append(("allreduce", *probe.allreduce_finding(cfg, ar, [g["name"] for g in gpus])))
    ok = all(r["status"] != "fail" for r in rows) and all(level != "fail" for _, level, _ in host)
    return {"rows": rows, "host": host, "ok": ok}


def table(result: dict, host: str = "") -> list[str]:
    """The printed form: one line per GPU (its problems, or ok), then the host's own findings."""
    lines = []
    for r in result["rows"]:
        bad = [f"{t}" for _, lv, t in r["findings"] if lv in ("fail", "warn")]
        lines.append(f"{host + ' ' if host else ''}GPU {r['index']} {r['uuid']} {r['name']}: {r['status'].upper()}"
                     + (": " + "; ".join(bad) if bad else ""))
    for _check, level, text in result["host"]:
        lines.append(f"{host + ' ' if host else ''}{level.upper()}: {text}")
    return lines
