"""The GPU-list grammar of a run: `target_gpus`, `drafter_gpus` and a vLLM server's `gpus`.

A value is comma-separated entries, each a GPU index or `cpu` (one CPU process each, so `cpu,cpu`
is two): "0,1,2", 3 (YAML's number), "cpu". The one parser of it; the plan counts a run's GPUs
with it and the trainer turns its entries into devices.

    entries("0, 1")  -> [0, 1]        entries("cpu,cpu") -> ['cpu', 'cpu']
    indices("cpu")   -> []            indices(3) -> [3]          entries("0,x") -> ValueError
"""

from __future__ import annotations


def entries(value) -> list:
    """The entries of a GPU list, in order: an int per GPU index, 'cpu' per CPU entry (any case).
    Empty entries ("0,,1") are skipped. Raises ValueError naming the first entry that is neither,
    or saying the list is empty."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a GPU list")
    out: list = []
    for item in (x.strip() for x in value.split(",")):
        if item.lower() == "cpu":
            out.append("cpu")
        elif item.isdigit():
            out.append(int(item))
        elif item:
            raise ValueError(f"{item!r} is not a GPU index or cpu")
    if not out:
        raise ValueError("no GPU index or cpu")
    return out


def indices(value) -> list[int]:
    """The GPU indices of a GPU list, in order (its `cpu` entries left out)."""
    return [e for e in entries(value) if e != "cpu"]
