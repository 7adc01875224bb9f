"""Target-only throughput at a real shape (random weights, built on the device: nothing on disk),
through the trainer's own `HiddenStateProducer.forward`: features from the drafter's target
layers and the final normed hidden state, as a training step asks for them.

    python -m tests.benchmarks.bench_target --shape qwen3.6-27b --seqs 8 --seq-len 8192 [--no-soft-labels]
    python -m tests.benchmarks.bench_target --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512 [--padded]

From the repository root, with PYTHONPATH=trainer:kernels:module_utils (a benchmark, not part of the trainer package).

With --min-len, sequence lengths are drawn uniformly from [--min-len, --seq-len] (seeded) and the
micro-batch runs as the trainer runs it, in length groups (`forward_batch`), or with --padded as one
forward padded to the longest (the anchor); tokens/s counts real tokens only.

Prints target tokens/s (median of --steps timed forwards after --warmup), peak memory, and which
implementation transformers bound for a hybrid target's linear-attention kernels (run it once with
flash-linear-attention importable and once without to compare the fast kernels with the torch
fallback).
"""

import argparse
import json
import statistics
import time

import torch
from flashfleet_trainer.compilation import compile_decoder_layers
from flashfleet_trainer.shapes import SHAPES, shape_config
from flashfleet_trainer.target import (
    HiddenStateProducer,
    default_target_layers,
    fast_kernels,
    linear_attention_kernels,
    text_config_of,
)


def build_target(shape: str, layers: int | None, device: str, dtype):
    """The shape's language model on `device` with random weights (N(0, 0.02), norms at 1)."""
    from transformers import AutoModelForCausalLM

    text = text_config_of(shape_config(shape, layers))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(text, dtype=dtype)
    model.eval().requires_grad_(False)
    return model, text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.6-27b")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--draft-layers", type=int, default=5, help="how many target layers feed the drafter")
    p.add_argument("--no-soft-labels", action="store_true",
                   help="a CE-only run's forward: stop after the deepest feature layer (no final state)")
    p.add_argument("--min-len", type=int, default=None, help="draw lengths from [min-len, seq-len]")
    p.add_argument("--padded", action="store_true", help="one forward padded to the longest (the old path)")
    p.add_argument("--sdpa", choices=("default", "cudnn", "flash"), default="default",
                   help="the attention backend torch tries first (default: torch's own order)")
    p.add_argument("--short-conv", choices=("fla", "torch"), default="fla",
                   help="a hybrid target's short convolution: flash-linear-attention's kernel where it "
                        "imports (`short_conv.bind`, as the trainer loads a CUDA target) or transformers' torch path")
    p.add_argument("--compile", choices=("none", "parts", "layers"), default="none",
                   help="torch.compile each decoder layer's forward (layers: `compile_decoder_layers`, the "
                        "trainer's default for a CUDA target), only the norms and MLPs "
                        "(parts), or nothing (none: transformers' eager forward)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode for --compile layers (e.g. max-autotune-no-cudagraphs: inductor "
                        "searches Triton GEMM templates against cuBLAS and fuses the ops around them)")
    p.add_argument("--profile", type=int, default=0, help="profile this many more forwards and print GPU time shares")
    p.add_argument("--trace", default=None, help="where to write the profiler's chrome trace")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    t0 = time.perf_counter()
    model, text = build_target(a.shape, a.layers, dev, dtype)
    print(f"built {a.shape} ({text.num_hidden_layers} layers, "
          f"{sum(x.numel() for x in model.parameters()) / 1e9:.2f}B params) on {dev} in {time.perf_counter() - t0:.0f} s",
          flush=True)
    if a.short_conv == "fla":
        fast_kernels(model)
    if a.compile == "parts":
        compile_parts(model)
    elif a.compile == "layers":
        compile_decoder_layers(model, mode=a.compile_mode)
    layer_ids = default_target_layers(text.num_hidden_layers, a.draft_layers)
    producer = HiddenStateProducer(None, [dev], layer_ids, dev, replicas=[(dev, model)])
    kernels = linear_attention_kernels(text) if "qwen3_5" in getattr(text, "model_type", "") else {}
    ids = torch.randint(0, text.vocab_size - 1, (a.seqs, a.seq_len))
    lengths = torch.full((a.seqs,), a.seq_len)
    if a.min_len is not None:
        lengths = torch.randint(a.min_len, a.seq_len + 1, (a.seqs,), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(a.seq_len)[None] < lengths[:, None]).long()
    want_last = not a.no_soft_labels

    def step():
        if a.padded:
            return producer.forward(ids, mask, want_last=want_last)
        return producer.forward_batch(ids, lengths, want_last=want_last)

    with sdpa_first(a.sdpa):
        times = timed_forwards(step, a.warmup, a.steps, dev)
    tokens = int(lengths.sum())
    med = statistics.median(times)
    out = {"shape": a.shape, "layers": text.num_hidden_layers, "tokens_per_forward": tokens,
           "padded_tokens": a.seqs * a.seq_len, "path": "padded" if a.padded else "length groups",
           "target_tokens_per_s": tokens / med, "spread": (max(times) - min(times)) / med,
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None,
           "linear_attention": kernels, "target_layer_ids": layer_ids, "sdpa": a.sdpa, "compile": a.compile, "compile_mode": a.compile_mode,
           "layers_run": max(layer_ids) + 1 if a.no_soft_labels else text.num_hidden_layers}
    print(json.dumps(out), flush=True)
    if a.profile:
        profile(step, a.profile, a.trace or "/tmp/bench_target_trace.json")


def profile(step, n, path) -> None:
    """GPU kernel time of n more forwards by kind (GEMM, attention, linear attention, convolution,
    elementwise and copies), from torch.profiler; the chrome trace is kept at `path`."""
    from torch.profiler import ProfilerActivity, profile

    from tests.benchmarks.bench_drafter import idle_table, share_table

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    print(share_table(path, regions=(), outside="forward"), flush=True)
    print(idle_table(path, steps=n), flush=True)


def compile_parts(model) -> None:
    """Compile only the decoder layers' norms and MLPs in place (--compile parts)."""
    for layer in model.get_decoder().layers:
        for name, sub in list(layer.named_modules()):
            if name and (name.endswith("norm") or name == "mlp"):
                sub.forward = torch.compile(sub.forward, dynamic=True)


def sdpa_first(backend: str):
    """A context in which scaled_dot_product_attention tries `backend` first (then torch's others)."""
    import contextlib

    if backend == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    first = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    rest = [b for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH) if b != first]
    return sdpa_kernel([first, *rest], set_priority=True)


def timed_forwards(step, warmup, steps, dev) -> list[float]:
    times = []
    for i in range(warmup + steps):
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if dev == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        print(f"{'warm-up' if i < warmup else 'step'} {i}: {dt:.3f} s", flush=True)
        if i >= warmup:
            times.append(dt)
    return times

if __name__ == "__main__":
    main()
