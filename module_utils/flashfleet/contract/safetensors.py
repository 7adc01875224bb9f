"""The safetensors header check: one parser for checkpoints, staged models and the trainer.

A file is an 8-byte little-endian header length, a JSON header {tensor: {dtype, shape,
data_offsets}} (plus `__metadata__`), then the data. A file passes when the header parses, every
tensor's byte span matches its dtype and shape, and the spans tile the data exactly: a truncated
or padded file fails without reading its data.
"""

import json
import os
import struct

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER = 100 * 2**20
INDEX = "model.safetensors.index.json"


def parse_header(head8: bytes, header_bytes: bytes, file_size: int) -> tuple[dict, list[str]]:
    """({tensor: {"dtype", "shape", "nbytes"}}, [problems]) of one file's header bytes."""
    if len(head8) < 8:
        return {}, ["shorter than the 8-byte header length"]
    (n,) = struct.unpack("<Q", head8)
    if n > file_size - 8 or n > MAX_HEADER:
        return {}, [f"header length {n} does not fit in a {file_size}-byte file"]
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return {}, [f"header is not JSON ({e})"]
    if not isinstance(header, dict):
        return {}, ["header is not a JSON object"]
    data_len = file_size - 8 - n
    tensors, spans, problems = {}, [], []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
            start, end = int(start), int(end)
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: malformed entry")
            continue
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            problems.append(f"{name}: unknown dtype {dtype}")
            continue
        count = 1
        for d in shape:
            count *= d
        nbytes = count * DTYPE_BYTES[dtype]
        if not (0 <= start <= end <= data_len):
            problems.append(f"{name}: offsets {start}-{end} outside the {data_len}-byte data")
            continue
        if end - start != nbytes:
            problems.append(f"{name}: {end - start} bytes for {dtype}{shape} which needs {nbytes}")
        tensors[name] = {"dtype": dtype, "shape": shape, "nbytes": end - start}
        spans.append((start, end))
    pos = 0
    for start, end in sorted(spans):
        if start != pos:
            problems.append(f"data not contiguous at byte {pos} (next tensor starts at {start})")
            break
        pos = end
    if not problems and pos != data_len:
        problems.append(f"tensors cover {pos} of {data_len} data bytes (truncated or padded file)")
    return tensors, problems


def read_header(path) -> tuple[dict, list[str]]:
    """parse_header of the file at path; an unreadable file is a problem, not an exception."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head8 = f.read(8)
            n = struct.unpack("<Q", head8)[0] if len(head8) == 8 else 0
            body = f.read(n) if len(head8) == 8 and n <= min(size - 8, MAX_HEADER) else b""
    except OSError as e:
        return {}, [f"unreadable: {e.strerror or e}"]
    return parse_header(head8, body, size)


def check_dir(root) -> list[str]:
    """Problems of a model directory: every shard's header, and with an index, every tensor in
    the shard the index names and the tensors' bytes adding up to the index's total_size."""
    problems, shards = [], {}
    for dirpath, _dirs, names in os.walk(root):
        for fn in sorted(names):
            if fn.endswith(".safetensors"):
                p = os.path.join(dirpath, fn)
                rel = os.path.relpath(p, root)
                tensors, errs = read_header(p)
                problems += [f"{rel}: {e}" for e in errs]
                shards[rel] = tensors
    index_path = os.path.join(root, INDEX)
    if os.path.exists(index_path):
        try:
            with open(index_path) as f:
                index = json.load(f)
            weight_map = index["weight_map"]
            weight_map.items()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return problems + [f"{INDEX}: unreadable ({e})"]
        total = 0
        for tensor, shard in weight_map.items():
            if shard not in shards:
                problems.append(f"index names shard {shard} (for {tensor}), which is missing")
            elif tensor not in shards[shard]:
                problems.append(f"index puts {tensor} in {shard}, whose header lacks it")
            else:
                total += shards[shard][tensor]["nbytes"]
        want = (index.get("metadata") or {}).get("total_size")
        if want is not None and int(want) != total:
            problems.append(f"index total_size {want} != {total} bytes of tensors in the shards")
    return problems
