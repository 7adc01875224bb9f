"""Benchmark: forward+backward time and peak extra memory of the drafter loss on one CUDA GPU.

    python -m flashfleet_kernels.bench                      # the issue's grid, ours/torch/liger
    python -m flashfleet_kernels.bench --n 8192 --v 151936 --breakdown
    python -m flashfleet_kernels.bench --sweep              # chunk/block/warps for the default shape

"ours" is the fused Triton path, "torch" the fp32 materializing reference, "liger" Liger-Kernel's
``LigerFusedLinearJSDLoss(beta=0)`` when importable (it has no per-row weights, so it computes a
slightly different loss; it is here for speed and memory). Inputs are bf16, the head is frozen, the
gradient goes to the student hidden states only. Time is the median of ``--reps`` runs after
``--warmup``; "peak" is the maximum memory allocated during one forward+backward above what was
allocated before it (inputs), so it includes the ``[N, d]`` gradient. Rows 0 mod 97 are ignored and
the weights are random in [0, 1), so the per-row-weight code path is what gets timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

GiB = 1024**3


def make_inputs(n: int, v: int, d: int, dtype=torch.bfloat16, seed: int = 0, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    h_s = torch.randn(n, d, device=device, dtype=dtype, generator=gen)
    h_t = (h_s.float() + 0.5 * torch.randn(n, d, device=device, generator=gen)).to(dtype)
    weight = (torch.randn(v, d, device=device, generator=gen) * d**-0.5 * 2).to(dtype)
    labels = torch.randint(0, v, (n,), device=device, generator=gen)
    labels[::97] = -100
    row_weights = torch.rand(n, device=device, generator=gen)
    return h_s.requires_grad_(), h_t, weight, labels, row_weights


def _ours(temperature, kl_weight, **knobs):
    from flashfleet_kernels.distill_loss import triton_fused_linear_distill_loss

    def run(h_s, h_t, weight, labels, row_weights):
        return triton_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights,
                                                temperature=temperature, kl_weight=kl_weight, **knobs)
    return run


def _torch(temperature, kl_weight):
    from flashfleet_kernels.reference import reference_fused_linear_distill_loss

    def run(h_s, h_t, weight, labels, row_weights):
        return reference_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights,
                                                   temperature=temperature, kl_weight=kl_weight)
    return run


def _liger(temperature, kl_weight):
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=1.0 - kl_weight, weight_soft_loss=kl_weight,
                                      beta=0.0, temperature=temperature)

    def run(h_s, h_t, weight, labels, row_weights):
        return loss_fn(h_s, weight, h_t, weight, labels)
    return run


def measure(fn, inputs, reps: int, warmup: int):
    """Median fwd+bwd milliseconds and peak extra GiB, or the reason it could not run."""
    h_s = inputs[0]
    try:
        for _ in range(warmup):
            h_s.grad = None
            fn(*inputs).backward()
        torch.cuda.synchronize()
        h_s.grad = None
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn(*inputs).backward()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / GiB
        times = []
        for _ in range(reps):
            h_s.grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs).backward()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times), peak
    except torch.OutOfMemoryError:
        return "OOM", None
    finally:
        h_s.grad = None
        torch.cuda.empty_cache()


class _Stopwatch:
    """Marks between phases: CUDA events on a GPU, the wall clock elsewhere (the Triton interpreter)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def laps_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]


def breakdown(inputs, temperature, kl_weight, chunk_size=None, reps: int = 5, row_group: int = 1,
              ignore_index: int = -100):
    """Where one fused forward+backward spends its time: the chunk loop, phase by phase.

    Runs what the loss runs (:func:`~flashfleet_kernels.distill_loss.prepare_inputs`, then the same
    :class:`~flashfleet_kernels.distill_loss.ChunkLoop`: same chunking, same kernel launch; callable
    ``row_weights`` time its two launches and the weight function), one chunk at a time between
    timing marks; only the gradient to the student hidden states is computed (a frozen head).
    Returns ``(rows per chunk, {phase: ms per fwd+bwd})``.
    """
    from flashfleet_kernels import distill_loss as dl

    h_s, h_t, weight, labels, row_weights = inputs
    h_s, h_t, weight, labels, row_weights = dl.prepare_inputs(
        h_s.detach(), h_t, weight.detach(), labels, row_weights, temperature=temperature, kl_weight=kl_weight,
        row_group=row_group)
    logits = "student+teacher logits (2 GEMMs)" if kl_weight != 0 else "student logits (GEMM)"
    names = [logits, "row kernel", "grad GEMM"]
    phases = dict.fromkeys(names, 0.0)
    chunk = None
    for rnd in range(reps + 1):  # round 0 is warm-up
        loop = dl.ChunkLoop(h_s, h_t, weight, labels, row_weights, temperature=float(temperature),
                            kl_weight=float(kl_weight), ignore_index=ignore_index, chunk_size=chunk_size,
                            row_group=row_group, need_grad_h=True, need_grad_w=False)
        chunk = loop.chunk_size
        watch = _Stopwatch(h_s.device)
        for k in range(len(loop)):
            watch.mark()
            loop.logits(k)
            watch.mark()
            loop.rows(k)
            watch.mark()
            loop.grads(k)
            watch.mark()
        laps = watch.laps_ms()
        if rnd > 0:
            for k in range(len(loop)):
                for i, name in enumerate(names):
                    phases[name] += laps[4 * k + i] / reps
    return chunk, phases


def matmul_flops(n, v, d, kl_weight):
    return (3 if kl_weight else 2) * 2 * n * v * d


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--v", type=int, nargs="+", default=[151936, 248320])
    p.add_argument("--d", type=int, default=5120)
    p.add_argument("--impls", default="ours,torch,liger")
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--kl-weight", type=float, default=0.7)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--breakdown", action="store_true", help="time the fused loop phase by phase")
    p.add_argument("--sweep", action="store_true", help="try chunk sizes / blocks / warps at --n[0]")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 1

    T, a = args.temperature, args.kl_weight
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}, bf16, d={args.d}, T={T}, kl_weight={a}")
    makers = {"ours": lambda: _ours(T, a, chunk_size=args.chunk_size), "torch": lambda: _torch(T, a),
              "liger": lambda: _liger(T, a)}
    impls = []
    for name in args.impls.split(","):
        try:
            impls.append((name, makers[name]()))
        except ImportError as exc:
            print(f"# {name}: not available ({exc})")

    if args.sweep:
        for v in args.v:
            inputs = make_inputs(args.n[0], v, args.d)
            for chunk in (384, 512, 640, 768, 1024, 1280):
                for block, warps in ((2048, 4), (4096, 8)):
                    fn = _ours(T, a, chunk_size=chunk, block_size=block, num_warps=warps)
                    ms, peak = measure(fn, inputs, args.reps, args.warmup)
                    print(f"sweep N={args.n[0]} V={v} chunk={chunk} block={block} warps={warps}: "
                          f"{ms:.1f} ms, {peak:.2f} GiB", flush=True)
            del inputs
        return 0

    print("| N | V | impl | fwd+bwd ms | peak extra GiB | matmul TFLOP/s |")
    print("|---:|---:|---|---:|---:|---:|")
    for v in args.v:
        for n in args.n:
            inputs = make_inputs(n, v, args.d)
            for name, fn in impls:
                ms, peak = measure(fn, inputs, args.reps, args.warmup)
                if isinstance(ms, str):
                    print(f"| {n:,} | {v:,} | {name} | {ms} | - | - |", flush=True)
                    continue
                tflops = matmul_flops(n, v, args.d, a) / (ms * 1e-3) / 1e12
                print(f"| {n:,} | {v:,} | {name} | {ms:.1f} | {peak:.2f} | {tflops:.0f} |", flush=True)
            if args.breakdown:
                c, phases = breakdown(inputs, T, a, args.chunk_size)
                parts = ", ".join(f"{k} {ms:.1f} ms" for k, ms in phases.items())
                print(f"#   breakdown N={n} V={v} chunk={c}: {parts}", flush=True)
            del inputs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
