"""The drafter's flex attention (one layer: forward + backward) under flex_attention kernel options,
on one CUDA GPU, at a published shape with a micro-batch built as the trainer builds it.

    python tests/benchmarks/bench_flex.py --shape qwen3-8b [--autotune] [--configs '[{"BLOCK_M1": 32}]']

Prints one JSON line per (kernel options, layer type): median forward and forward + backward
times over --reps calls, their spread ((max - min) / median), and the largest difference of the
output and of each gradient from the first line's (inductor's defaults: the anchor, measured in
the same process). `--autotune` adds inductor's max-autotune search over its flex configurations
(it benchmarks them while compiling, minutes). The options reach the kernels through
`attention.FLEX_KERNEL_OPTIONS`, the trainer's own setting.
"""

import argparse
import json
import statistics

import numpy as np
import torch
from bench_drafter import drafter_config  # (run as a script: this folder is on the path)
from flashfleet_trainer import attention
from flashfleet_trainer.attention import SparseAttention, flex_layouts
from flashfleet_trainer.data import build_blocks, sample_anchors
from gemm_ceiling import timed  # CUDA events around each call (run as a script: this folder is on the path)

# Inductor's default for head dim 128 on sm90 is (64, 128, 128, 64) with 3 stages and 8 warps
# (template_heuristics); the others are its autotune space's neighbours.
CONFIGS = [
    None,
    {"BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64, "bwd_num_stages": 3, "bwd_num_warps": 4},
    {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "bwd_num_stages": 3, "bwd_num_warps": 4},
    {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "bwd_num_stages": 2, "bwd_num_warps": 8},
    {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "bwd_num_stages": 4, "bwd_num_warps": 4},
    {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_stages": 3, "fwd_num_warps": 8},
]


def summary(ms, digits=3):
    """The median of timings in ms and their spread, (max - min) / median."""
    med = statistics.median(ms)
    return round(med, digits), round((max(ms) - min(ms)) / med, 3)


def batch_args(p):
    """The micro-batch's arguments: a published drafter shape, sequences, anchors, block size."""
    p.add_argument("--shape", default="qwen3-8b")
    p.add_argument("--seqs", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)


def micro_batch(a, layers, dev):
    """The drafter config of `a.shape` with `layers` layers and the `SparseAttention` of a micro-batch
    built as the trainer builds it (random tokens, anchors sampled with seed 0)."""
    cfg = drafter_config(a.shape, 151936, layers, a.block_size)
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 1000, size=a.seq_len) for _ in range(a.seqs)]
    masks = [np.ones(a.seq_len, dtype=np.int64) for _ in range(a.seqs)]
    gen = torch.Generator().manual_seed(0)
    blocks = build_blocks(tokens, masks, sample_anchors(masks, a.anchors, gen), a.block_size, cfg.mask_token_id)
    return cfg, SparseAttention(flex_layouts(cfg, blocks), dev)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_args(p)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--configs", default=None, help="JSON list of kernel_options dicts (null: the defaults)")
    p.add_argument("--autotune", action="store_true", help="also inductor's max-autotune choice")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    dev = "cuda"
    cfg, attn = micro_batch(a, a.layers, dev)
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(nh, attn.m, hd, device=dev, generator=g, dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(nkv, attn.t + attn.m, hd, device=dev, generator=g, dtype=torch.bfloat16).requires_grad_()
    v = torch.randn(nkv, attn.t + attn.m, hd, device=dev, generator=g, dtype=torch.bfloat16).requires_grad_()
    dout = torch.randn(nh, attn.m, hd, device=dev, generator=g, dtype=torch.bfloat16)
    configs = json.loads(a.configs) if a.configs else CONFIGS
    runs = [(c, False) for c in configs] + ([(None, True)] if a.autotune else [])
    print(json.dumps({"shape": a.shape, "rows": attn.m, "context": attn.t, "q_len": attn.q_len, "kv_len": attn.kv_len,
                      "heads": [nh, nkv, hd], "device": torch.cuda.get_device_name()}), flush=True)
    anchor = {}
    for options, autotune in runs:
        attention.FLEX_KERNEL_OPTIONS = options
        mode = "max-autotune-no-cudagraphs" if autotune else None
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.reset()  # each configuration compiled afresh (the earlier ones' graphs count to dynamo's limit)
        attention._FLEX["cuda"] = torch.compile(flex_attention, dynamic=False, mode=mode)
        for kind in attn.block_masks:
            def fwd(kind=kind):
                with torch.no_grad():
                    return attn.attend(q, k, v, kind)

            def fwd_bwd(kind=kind):
                for t in (q, k, v):
                    t.grad = None
                attn.attend(q, k, v, kind).backward(dout)

            row = {"kernel_options": options, "autotune": autotune, "layer_type": kind}
            try:
                for _ in range(a.warmup):
                    fwd_bwd()
                    fwd()
                row["fwd_ms"], row["fwd_spread"] = summary(timed(fwd, a.reps))
                row["fwd_bwd_ms"], row["fwd_bwd_spread"] = summary(timed(fwd_bwd, a.reps))
                out = [fwd().float(), *(t.grad.float() for t in (q, k, v))]
            except Exception as e:  # a configuration the kernel cannot take: say so, go on
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(json.dumps(row), flush=True)
                continue
            if kind not in anchor:
                anchor[kind] = out
            row["max_abs_diff"] = [round(float((x - y).abs().max()), 5) for x, y in zip(out, anchor[kind], strict=True)]
            print(json.dumps(row), flush=True)
    attention.FLEX_KERNEL_OPTIONS = None


if __name__ == "__main__":
    main()
