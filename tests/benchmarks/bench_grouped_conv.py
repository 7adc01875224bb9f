"""DFlash 2's grouped convolution at the Qwen3.6-27B drafter's shape: the Triton kernels
(flashfleet_kernels.grouped_conv), forward and backward apart, at several tiles and warp counts,
against the torch version compiled by inductor (what the drafter ran before the kernels), on one
CUDA device.

    python -m tests.benchmarks.bench_grouped_conv [--rows 8192] [--configs 32x256x4,16x256x4,...]

A configuration is rows x channels x warps of one program's tile, and optionally x the backward's
tiles a program (its loop; the forward takes one) x its pipeline stages. Prints per direction and configuration
the median of 20 timed passes after 3 warm-ups (CUDA events) and the bandwidth it implies: the
forward moves x and y, the backward x, dy and dx (bf16; the small delta, base and their gradients
not counted), then the best configuration of each direction."""

import argparse
import statistics

import torch
from flashfleet_kernels import grouped_conv as gc
from flashfleet_trainer.dflash2 import grouped_conv as torch_conv


def median_ms(fn, setup=lambda: None, reps=20, warm=3):
    """The median time of fn(setup()) over reps, setup's own work before the timed region."""
    times = []
    for i in range(warm + reps):
        arg = setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(arg)
        end.record()
        torch.cuda.synchronize()
        if i >= warm:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def directions(conv, x, delta, base, block, dy):
    """(forward ms, backward ms) of conv: the forward without autograd, the backward of a fresh
    forward each time (its graph freed by the backward, as in training; the forward untimed)."""
    with torch.no_grad():
        fwd = median_ms(lambda _: conv(x, delta, base, block))
    leaves = [t.detach().requires_grad_() for t in (x, delta, base)]
    bwd = median_ms(lambda y: torch.autograd.grad(y, leaves, dy), setup=lambda: conv(*leaves, block))
    return fwd, bwd


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--taps", type=int, default=2)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--configs", default="32x256x4,16x256x4,8x256x4,32x256x8,16x256x8,64x256x8,16x128x4,"
                                        "8x128x4,32x128x4,16x512x8,8x512x4,8x256x2,16x256x4x4,16x256x4x8,"
                                        "16x256x4x16,8x256x4x8,8x256x4x16,16x128x4x8,32x256x8x4,16x256x8x8,"
                                        "16x256x4x8x2,16x256x4x8x3,16x256x4x16x2,8x256x4x16x2,16x128x4x8x2")
    a = p.parse_args(argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    groups = a.hidden // a.group
    x = torch.randn(a.rows, a.hidden, device="cuda", generator=g).bfloat16()
    # the drafter's delta is a view of one projection giving both sides' deltas: so is this one
    delta = (torch.randn(a.rows, 2, a.taps, groups, device="cuda", generator=g) * 0.1).bfloat16()[:, 0]
    base = torch.randn(a.taps, a.hidden, device="cuda", generator=g)
    dy = torch.randn(a.rows, a.hidden, device="cuda", generator=g).bfloat16()
    plane = x.numel() * x.element_size()
    gbs = lambda planes, ms: f"{planes * plane / ms / 1e6:.0f} GB/s"  # noqa: E731
    fwd, bwd = directions(torch.compile(torch_conv, dynamic=True), x, delta, base, a.block, dy)
    print(f"torch compiled: forward {fwd:.3f} ms ({gbs(2, fwd)}), backward {bwd:.3f} ms ({gbs(3, bwd)})", flush=True)
    best = {"forward": (float("inf"), None), "backward": (float("inf"), None)}
    for cfg in a.configs.split(","):
        rows, cols, warps, loop, stages = ([int(v) for v in cfg.split("x")] + [1, 1])[:5]
        gc.FORWARD = {"rows": rows, "cols": cols, "warps": warps}
        gc.BACKWARD = gc.FORWARD | {"loop": loop, "stages": stages}
        fwd, bwd = directions(gc.grouped_conv, x, delta, base, a.block, dy)
        print(f"kernel {rows} rows x {cols} channels, {warps} warps, backward loop {loop} stages {stages}: forward {fwd:.3f} ms ({gbs(2, fwd)}), "
              f"backward {bwd:.3f} ms ({gbs(3, bwd)})", flush=True)
        best = {"forward": min(best["forward"], (fwd, cfg)), "backward": min(best["backward"], (bwd, cfg))}
    print("best: " + ", ".join(f"{d} {cfg} ({ms:.3f} ms)" for d, (ms, cfg) in best.items()), flush=True)


if __name__ == "__main__":
    main()
