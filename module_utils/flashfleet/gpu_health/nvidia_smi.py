"""`nvidia-smi -q` (its human-readable report) as facts per GPU.

The report is an indented tree: `Key : value` leaves and bare section names, one `GPU <bus id>`
section per GPU in index order. Field names move between driver branches (Clocks Throttle Reasons
became Clocks Event Reasons; the volatile ECC counters became SRAM/DRAM, then SRAM Parity/SEC-DED),
so each fact is looked up by the names along its path, not by a fixed position, and a missing one
is None ("not reported"), never a failure by itself.
"""

from __future__ import annotations

import re

COMMAND = ["nvidia-smi", "-q"]

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>\S.*?)\s+:\s?(?P<value>.*)$")
_SECTION = re.compile(r"^(?P<indent>\s*)(?P<key>\S.*?)\s*$")
_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")


def flatten(text: str) -> list[tuple[tuple[str, ...], str | None]]:
    """Every line of the report as (path of names from the top, value or None for a section)."""
    out, stack = [], []  # stack: (indent, name)
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("="):
            continue
        m = _KEY.match(line)
        if m and not _GPU.match(line.strip()):
            indent, key, value = len(m.group("indent")), m.group("key"), m.group("value").strip()
        else:
            m = _SECTION.match(line)
            indent, key, value = len(m.group("indent")), m.group("key"), None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(n for _, n in stack) + (key,)
        out.append((path, value))
        stack.append((indent, key))  # a leaf with a value may still have children (HW Slowdown)
    return out


def parse(text: str) -> dict:
    """{"driver": str|None, "gpus": [{"path values" of one GPU, keyed by path below its section}]}."""
    driver, gpus = None, []
    for path, value in flatten(text):
        if path == ("Driver Version",):
            driver = value
        elif len(path) == 1 and _GPU.match(path[0]) and value is None:
            gpus.append({"bus": _GPU.match(path[0]).group("bus"), "fields": []})
        elif gpus and _GPU.match(path[0]):
            gpus[-1]["fields"].append((path[1:], value))
    return {"driver": driver, "gpus": [facts(g["bus"], g["fields"], driver, i) for i, g in enumerate(gpus)]}


def _find(fields, *names, under: str | None = None):
    """The value of the first field whose path ends with names[-1] and holds all of `names` in
    order (and `under` among its sections, when given); None when absent."""
    for path, value in fields:
        if path[-1] != names[-1] or (under and under not in path[:-1]):
            continue
        it = iter(path)
        if all(n in it for n in names):
            return value
    return None


def _int(value) -> int | None:
    m = re.match(r"^\s*(\d+)", value or "")
    return int(m.group(1)) if m else None


def _yes(value) -> bool | None:
    v = (value or "").strip().lower()
    return True if v in ("yes", "active", "enabled") else False if v in ("no", "not active", "disabled") else None


def facts(bus: str, fields, driver: str | None, index: int) -> dict:
    """The facts the checks read, for one GPU section."""
    ecc = [(_int(v), path) for path, v in fields if len(path) >= 2 and path[0] == "ECC Errors" and "Volatile" in path
           and v is not None and ("Uncorrectable" in path[-1] or ("Double Bit" in path and path[-1] == "Total"))]
    ecc_known = [n for n, _ in ecc if n is not None]
    throttle_section = next((p[0] for p, _ in fields if p[0] in ("Clocks Event Reasons", "Clocks Throttle Reasons")), None)
    pending = [_find(fields, "Retired Pages", "Pending Page Blacklist"), _find(fields, "Retired Pages", "Pending Page Retirement")]
    return {
        "index": index,
        "bus": bus,
        "name": _find(fields, "Product Name"),
        "uuid": _find(fields, "GPU UUID"),
        "driver": driver,
        "persistence": _yes(_find(fields, "Persistence Mode")),
        "ecc_uncorrectable": sum(ecc_known) if ecc_known else None,
        "retired_pending": next((_yes(p) for p in pending if _yes(p) is not None), None),
        "remap_pending": _yes(_find(fields, "Remapped Rows", "Pending")),
        "remap_failure": _yes(_find(fields, "Remapped Rows", "Remapping Failure Occurred")),
        "remap_uncorrectable": _int(_find(fields, "Remapped Rows", "Uncorrectable Error")),
        "throttle": {name: _yes(_find(fields, throttle_section, label)) if throttle_section else None
                     for name, label in (("hw_slowdown", "HW Slowdown"), ("hw_thermal", "HW Thermal Slowdown"),
                                         ("hw_power_brake", "HW Power Brake Slowdown"),
                                         ("sw_thermal", "SW Thermal Slowdown"), ("sw_power_cap", "SW Power Cap"))},
        "pcie": {"gen_max": _int(_find(fields, "PCIe Generation", "Max")),
                 "gen_current": _int(_find(fields, "PCIe Generation", "Current")),
                 "gen_device_max": _int(_find(fields, "PCIe Generation", "Device Max")),
                 "gen_host_max": _int(_find(fields, "PCIe Generation", "Host Max")),
                 "width_max": _int(_find(fields, "Link Width", "Max")),
                 "width_current": _int(_find(fields, "Link Width", "Current"))},
        "temperature_c": _int(_find(fields, "Temperature", "GPU Current Temp")),
    }


def bus_key(bus: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address as nvidia-smi (00000000:3B:00.0) or the kernel's Xid
    line (PCI:0000:3b:00) writes it, so the two compare equal."""
    m = re.search(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})", bus or "")
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None
