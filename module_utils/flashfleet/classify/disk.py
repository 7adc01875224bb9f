"""Reader of the disk evidence (evidence.py's disk_state): free space of the output filesystem
and /dev/shm."""

from __future__ import annotations

from .signatures import NEARLY_FULL_BYTES, NEARLY_FULL_FRACTION


def nearly_full(disk: dict) -> bool:
    free, total = disk.get("free_bytes"), disk.get("total_bytes")
    if free is None:
        return False
    return free < NEARLY_FULL_BYTES or (bool(total) and free < NEARLY_FULL_FRACTION * total)


def size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


