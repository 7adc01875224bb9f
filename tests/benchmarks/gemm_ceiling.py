"""The cuBLAS bf16 GEMM rate at the fused loss's chunk shapes, isolated and sustained, on one GPU.

    python tests/benchmarks/gemm_ceiling.py [--d 5120] [--v 151936] [--chunk 1024]

The loss's time is three logits-sized GEMMs per chunk plus the row kernels, so the rate cuBLAS
sustains at these shapes, back to back for as long as the loss runs, is its floor. Each shape is
timed once after an idle second ("isolated") and as the median of a run of back-to-back calls
lasting about as long as the loss at N=8192 ("sustained"), with the SM clock and power read by
nvidia-smi during the sustained run.
"""

import argparse
import statistics
import subprocess
import time

import torch


def rate(flop, ms):
    return flop / (ms * 1e-3) / 1e12


def timed(fn, reps):
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in evs:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in evs]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=5120)
    p.add_argument("--v", type=int, default=151936)
    p.add_argument("--chunk", type=int, default=1024)
    a = p.parse_args()
    d, v, c = a.d, a.v, a.chunk
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(v, d, device="cuda", generator=g).bfloat16()
    h = torch.randn(2 * c, d, device="cuda", generator=g).bfloat16()
    z = torch.empty(2 * c, v, device="cuda", dtype=torch.bfloat16)
    gz = torch.randn(c, v, device="cuda", generator=g).bfloat16()
    gh = torch.empty(c, d, device="cuda", dtype=torch.bfloat16)
    sq = torch.randn(8192, 8192, device="cuda", generator=g).bfloat16()
    sq_out = torch.empty_like(sq)
    shapes = {
        f"logits [{c}x{d}] @ [{d}x{v}]": (lambda: torch.mm(h[:c], w.t(), out=z[:c]), 2 * c * d * v),
        f"logits [{2 * c}x{d}] @ [{d}x{v}] (student+teacher as one)": (lambda: torch.mm(h, w.t(), out=z), 4 * c * d * v),
        f"grad [{c}x{v}] @ [{v}x{d}]": (lambda: torch.mm(gz, w, out=gh), 2 * c * d * v),
        "square 8192^3": (lambda: torch.mm(sq, sq, out=sq_out), 2 * 8192**3),
    }
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, random data")
    print("| GEMM | isolated ms | isolated TFLOP/s | sustained ms (median) | spread | sustained TFLOP/s | SM MHz | W |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (fn, flop) in shapes.items():
        timed(fn, 3)
        time.sleep(1.0)
        iso = timed(fn, 1)[0]
        reps = max(20, int(60.0 / iso))  # ~60 ms of back-to-back work, the loss's length at N=8192
        reps *= 4  # and four times that, to see any clock drop
        mon = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                "-lms", "50"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.2)
        ts = timed(fn, reps)
        time.sleep(0.1)
        mon.terminate()
        samples = [line.split(",") for line in mon.communicate()[0].splitlines() if line.count(",") == 1]
        mhz = statistics.median(float(s[0]) for s in samples) if samples else float("nan")
        watt = max(float(s[1]) for s in samples) if samples else float("nan")
        med = statistics.median(ts)
        print(f"| {name} | {iso:.3f} | {rate(flop, iso):.0f} | {med:.3f} | {(max(ts) - min(ts)) / med:.1%} | "
              f"{rate(flop, med):.0f} | {mhz:.0f} | {watt:.0f} |", flush=True)


if __name__ == "__main__":
    main()
