"""DFlash 2's grouped convolution, forward + backward, at the Qwen3.6-27B drafter's shape: the
Triton kernels (flashfleet_kernels.grouped_conv) at several tiles and warp counts against the torch
version compiled by inductor (what the drafter ran before the kernels), on one CUDA device.

    python -m tests.benchmarks.bench_grouped_conv [--rows 8192] [--configs 32x256x4,16x512x4,...]

Prints per configuration the median of 20 timed forward + backward passes after 3 warm-ups (CUDA
events), and the bytes a pass must move over that time (x, the output, dy, dx: bf16)."""

import argparse
import statistics

import torch
from flashfleet_kernels import grouped_conv as gc
from flashfleet_trainer.dflash2 import grouped_conv as torch_conv


def timed(fn, x, delta, base, block, dy, reps=20, warm=3):
    times = []
    for i in range(warm + reps):
        xs = x.detach().requires_grad_()
        ds = delta.detach().requires_grad_()
        bs = base.detach().requires_grad_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(xs, ds, bs, block).backward(dy)
        end.record()
        torch.cuda.synchronize()
        if i >= warm:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--taps", type=int, default=2)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--configs", default="32x256x4,16x256x4,64x256x8,32x512x8,16x512x4,8x1024x4,32x128x4")
    a = p.parse_args(argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    groups = a.hidden // a.group
    x = torch.randn(a.rows, a.hidden, device="cuda", generator=g).bfloat16()
    delta = (torch.randn(a.rows, a.taps, groups, device="cuda", generator=g) * 0.1).bfloat16()
    base = torch.randn(a.taps, a.hidden, device="cuda", generator=g)
    dy = torch.randn(a.rows, a.hidden, device="cuda", generator=g).bfloat16()
    moved = 4 * x.numel() * x.element_size()
    compiled = torch.compile(torch_conv, dynamic=True)
    ms = timed(compiled, x, delta, base, a.block, dy)
    print(f"torch compiled: {ms:.3f} ms ({moved / ms / 1e6:.0f} GB/s of x, y, dy, dx)", flush=True)
    for cfg in a.configs.split(","):
        rows, cols, warps = (int(v) for v in cfg.split("x"))
        gc._ROWS, gc._COLS, gc._WARPS = rows, cols, warps
        ms = timed(gc.grouped_conv, x, delta, base, a.block, dy)
        print(f"kernel {rows} rows x {cols} channels, {warps} warps: {ms:.3f} ms ({moved / ms / 1e6:.0f} GB/s)",
              flush=True)


if __name__ == "__main__":
    main()
