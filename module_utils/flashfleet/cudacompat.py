"""CUDA toolkit -> minimum NVIDIA Linux driver, from NVIDIA's CUDA Toolkit release notes
("CUDA Toolkit and Corresponding Driver Versions", Linux x86_64 column).

The check is strict: the toolkit's own minimum, not the family's "minor version compatibility"
floor (e.g. 525.60.13 for all of 12.x). Triton compiles PTX at run time and hands it to the
driver's JIT, and minor version compatibility does not cover PTX newer than the driver: a trainer
on such a host fails at its first kernel launch, after the model has loaded. Fail at provision time.
"""

from __future__ import annotations

import re

# toolkit version -> minimum driver (Linux x86_64). X.Y entries are the GA release.
MIN_DRIVER = {
    "11.0": "450.36.06",
    "11.1": "455.23",
    "11.2": "460.27.03",
    "11.3": "465.19.01",
    "11.4": "470.42.01",
    "11.5": "495.29.05",
    "11.6": "510.39.01",
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.4.1": "550.54.15",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.6.2": "560.35.03",
    "12.6.3": "560.35.05",
    "12.8": "570.26",
    "12.8.1": "570.124.06",
    "12.9": "575.51.03",
    "12.9.1": "575.57.08",
    "13.0": "580.65.06",
    "13.0.1": "580.82.07",
    "13.0.2": "580.95.05",
}


def _key(v):
    return tuple(int(x) for x in v.split("."))


def parse_version(v):
    """'13.0.2' / '580.95.05' / '13.0' -> tuple of ints; ValueError on anything else."""
    v = str(v).strip()
    if not re.fullmatch(r"\d+(\.\d+){0,3}", v):
        raise ValueError(f"not a version: {v!r}")
    return _key(v)


def cuda_min_driver(toolkit):
    """Minimum driver for a toolkit version X.Y or X.Y.Z.

    X.Y.Z uses the newest table entry of the same X.Y whose patch is <= Z (an update not listed
    needs at least what the last listed one needed); X.Y alone uses the GA entry. Unknown X.Y
    raises ValueError (the table must be extended, not guessed).
    """
    parts = parse_version(toolkit)
    if len(parts) < 2:
        raise ValueError(f"toolkit version {toolkit!r} needs at least major.minor")
    family = f"{parts[0]}.{parts[1]}"
    if family not in MIN_DRIVER:
        known = ", ".join(sorted({k.rsplit('.', 1)[0] if k.count('.') == 2 else k for k in MIN_DRIVER}, key=_key))
        raise ValueError(f"CUDA {toolkit} is not in the driver table (known: {known}); add its row from NVIDIA's release notes")
    patch = parts[2] if len(parts) > 2 else 0
    best = MIN_DRIVER[family]
    for k, drv in MIN_DRIVER.items():
        kp = _key(k)
        if len(kp) == 3 and kp[:2] == parts[:2] and kp[2] <= patch and _key(drv) > _key(best):
            best = drv
    return best


def cuda_driver_ok(driver, toolkit):
    """True when driver >= the toolkit's minimum."""
    return parse_version(driver) >= parse_version(cuda_min_driver(toolkit))
