"""The GPU-list grammar of a run: `target_gpus`, `drafter_gpus` and a vLLM server's `gpus`.

A value is comma-separated entries, each a GPU index or `cpu` (one CPU process each, so `cpu,cpu`
is two): "0,1,2", 3 (YAML's number), "cpu". The one parser of it; the plan counts a run's GPUs
with it and the trainer turns its entries into devices.

    entries("0, 1")  -> [0, 1]        entries("cpu,cpu") -> ['cpu', 'cpu']
    indices("cpu")   -> []            indices(3) -> [3]          entries("0,x") -> ValueError
"""

from __future__ import annotations

# A GPU index of a run is nvidia-smi's, and nvidia-smi numbers GPUs in PCI bus order; CUDA's own
# default is fastest first, so on a host whose cards differ cuda:N (or CUDA_VISIBLE_DEVICES=N)
# could be another card than the inventory, the health check and the quarantine mean. Every
# process given a run's GPU indices (the trainer's unit, each vLLM server's, the health probe) gets
# this in its environment.
DEVICE_ORDER_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


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
