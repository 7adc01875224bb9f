"""`python -m flashfleet_trainer.gpu_probe --gpus 0,1,... [--level N] [--json]`: the health check's
measurements, with the trainer's own torch (roles/gpu_health runs it from the trainer's venv).

    matmul      a bf16 8192^3 matrix product on each GPU in turn: TFLOP/s (cuda events)
    all-reduce  one process per GPU, NCCL, float32 buffers of --allreduce-mib: time per all-reduce,
                algbw and nccl-tests' busbw (flashfleet.gpu_health.probe.busbw_gbs), and whether the
                sum came out right

Level 1 (the quick form before a launch): 10 products per GPU, 64 MiB all-reduced 10 times; level 2
and up: 50 products, 1 GiB 20 times. The GPUs are numbered as nvidia-smi numbers them
(CUDA_DEVICE_ORDER=PCI_BUS_ID) and each result carries the GPU's UUID, which the check matches.
Without a CUDA device it prints a skip with the reason and exits 0: the check says "skipped".
The judging (thresholds) is flashfleet.gpu_health's; this only measures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from flashfleet.gpu_health.probe import busbw_gbs
from flashfleet.plan.gpus import DEVICE_ORDER_ENV

# nvidia-smi's numbering, so --gpus means the same GPUs to the check and to this process (set
# before torch is imported, below).
os.environ.update(DEVICE_ORDER_ENV)

SIZES = {1: {"matmul_iters": 10, "allreduce_mib": 64, "allreduce_iters": 10},
         2: {"matmul_iters": 50, "allreduce_mib": 1024, "allreduce_iters": 20}}
MATMUL_N = 8192


def sizes(level: int) -> dict:
    return SIZES[1 if level <= 1 else 2]


def uuid_of(torch, index: int) -> str:
    """'GPU-<uuid>' of a CUDA device, as nvidia-smi prints it."""
    u = str(torch.cuda.get_device_properties(index).uuid)
    return u if u.startswith("GPU-") else f"GPU-{u}"


def matmul(torch, index: int, iters: int, n: int = MATMUL_N) -> dict:
    dev = torch.device("cuda", index)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    with torch.cuda.device(dev):
        for _ in range(3):  # warm-up: cuBLAS picks its kernel, clocks rise
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            a @ b
        end.record()
        end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    return {"index": index, "uuid": uuid_of(torch, index), "name": torch.cuda.get_device_name(index),
            "tflops": 2 * n**3 * iters / seconds / 1e12, "seconds": round(seconds, 6), "n": n, "iters": iters}


def _allreduce_rank(rank: int, gpus: list[int], port: int, nbytes: int, iters: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(gpus[rank])
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(gpus))
    try:
        x = torch.full((nbytes // 4,), float(rank + 1), device="cuda", dtype=torch.float32)
        for _ in range(3):  # warm-up: NCCL sets up its channels on the first calls
            dist.all_reduce(x)
        x.fill_(float(rank + 1))
        dist.all_reduce(x)  # the correctness sample: every element is 1 + 2 + ... + n
        want = len(gpus) * (len(gpus) + 1) / 2
        correct = bool(torch.all(x == want).item())
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / iters
        flags = torch.tensor([int(correct)], device="cuda")
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        slowest = torch.tensor([seconds], device="cuda", dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"seconds": slowest.item(), "correct": bool(flags.item())}, f)
    finally:
        dist.destroy_process_group()


def allreduce(gpus: list[int], mib: int, iters: int) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    if len(gpus) < 2:
        return {"skipped": f"one GPU ({gpus[0]}): nothing to all-reduce across"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nbytes = mib * 2**20
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "allreduce.json")
        mp.spawn(_allreduce_rank, args=(gpus, port, nbytes, iters, out), nprocs=len(gpus), join=True)
        with open(out) as f:
            r = json.load(f)
    return {"gpus": gpus, "bytes": nbytes, "iters": iters, "seconds": r["seconds"], "correct": r["correct"],
            "algbw_gbs": nbytes / r["seconds"] / 1e9, "busbw_gbs": busbw_gbs(nbytes, r["seconds"], len(gpus))}


def probe(gpus: list[int], level: int) -> dict:
    t0 = time.monotonic()
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"no torch here ({exc})"}
    if not torch.cuda.is_available():
        return {"skipped": f"torch {torch.__version__} sees no CUDA device (a host without GPUs, or a CPU build)",
                "torch": torch.__version__}
    n = torch.cuda.device_count()
    missing = [i for i in gpus if i >= n]
    if missing:
        return {"skipped": f"GPU(s) {missing} not visible to torch ({n} device(s))", "torch": torch.__version__}
    sz = sizes(level)
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "level": level, "gpus": []}
    for i in gpus:
        try:
            out["gpus"].append(matmul(torch, i, sz["matmul_iters"]))
        except RuntimeError as exc:  # a GPU that cannot run a product is itself the finding
            out["gpus"].append({"index": i, "uuid": uuid_of(torch, i), "name": torch.cuda.get_device_name(i),
                                "error": str(exc).splitlines()[0][:300]})
    t1 = time.monotonic()
    try:
        out["allreduce"] = allreduce(gpus, sz["allreduce_mib"], sz["allreduce_iters"])
    except Exception as exc:  # noqa: BLE001 - NCCL's failure is the finding, reported, not raised
        out["allreduce"] = {"gpus": gpus, "correct": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    out["matmul_s"], out["allreduce_s"] = round(t1 - t0, 3), round(time.monotonic() - t1, 3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashfleet_trainer.gpu_probe", description=__doc__.splitlines()[0])
    p.add_argument("--gpus", required=True, help="GPU indices as nvidia-smi numbers them, comma-separated")
    p.add_argument("--level", type=int, default=1, help="1: quick (before a launch); 2 and up: longer")
    p.add_argument("--json", action="store_true", help="one JSON line (what the check reads)")
    a = p.parse_args(argv)
    try:
        gpus = [int(g) for g in a.gpus.split(",") if g.strip()]
    except ValueError:
        print(f"--gpus {a.gpus!r}: give GPU indices such as 0,1,2", file=sys.stderr)
        return 78
    result = probe(gpus, a.level)
    if a.json:
        print(json.dumps(result))
    else:
        for g in result.get("gpus", []):
            print(f"GPU {g['index']} {g['uuid']}: {g.get('tflops', 0):.0f} TFLOP/s bf16" + (f" ({g['error']})" if "error" in g else ""))
        ar = result.get("allreduce")
        if not ar:
            print(f"skipped: {result.get('skipped')}")
        elif "busbw_gbs" in ar:
            print(f"all-reduce: busbw {ar['busbw_gbs']:.0f} GB/s across GPUs {ar['gpus']}")
        else:
            print(f"all-reduce: {ar.get('skipped') or ar.get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
