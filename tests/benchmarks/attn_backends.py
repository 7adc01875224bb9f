"""Causal GQA attention forward, as the frozen target runs it (no mask, every sequence full length),
through each kernel torch and the installed packages offer; prints one JSON line per backend with
its median time, TFLOP/s, spread and error against the first backend (what transformers' sdpa
path gets: torch's own choice).

    python tests/benchmarks/attn_backends.py --seqs 8 --seq-len 8192 --heads 32 --kv-heads 8 --head-dim 128
    python tests/benchmarks/attn_backends.py --seqs 1 --seq-len 8192 --heads 24 --kv-heads 4 --head-dim 256

Backends (a backend that cannot run the shape prints its error instead of figures):
  default       SDPA with enable_gqa, torch choosing the kernel (transformers' sdpa path: the anchor)
  flash-gqa     SDPA's flash kernel with enable_gqa
  cudnn-gqa     SDPA's cuDNN kernel with enable_gqa
  cudnn-expand  K/V heads repeated to the query heads, then SDPA's cuDNN kernel (the repeat timed too)
  flash-expand  the same repeat, then SDPA's flash kernel
  flex          flex_attention compiled, causal block mask, enable_gqa
  fa4           flash_attn.cute.flash_attn_func (the flash-attn-4 package), when importable

Query/key/value are made as transformers makes them: [B, S, H, D] projections viewed as
[B, H, S, D]. FLOPs counted: 4 * B * H * S^2 * D / 2 (causal).
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def repeat_heads(x, n):
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def backends(q, k, v, groups):
    def sdpa(backend, expand):
        def run():
            kk, vv = (repeat_heads(k, groups), repeat_heads(v, groups)) if expand else (k, v)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=not expand)
        return run

    out = {"default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
           "flash-gqa": sdpa(SDPBackend.FLASH_ATTENTION, False),
           "cudnn-gqa": sdpa(SDPBackend.CUDNN_ATTENTION, False),
           "cudnn-expand": sdpa(SDPBackend.CUDNN_ATTENTION, True),
           "flash-expand": sdpa(SDPBackend.FLASH_ATTENTION, True)}

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    s = q.shape[2]
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, s, s, device=q.device)
    flex = torch.compile(flex_attention)
    out["flex"] = lambda: flex(q, k, v, block_mask=mask, enable_gqa=True)
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # not installed: say so, once
        print(json.dumps({"backend": "fa4", "error": f"not importable: {e}"}), flush=True)
    else:
        def fa4():
            o = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
            return (o[0] if isinstance(o, tuple) else o).transpose(1, 2)
        out["fa4"] = fa4
    return out


def timed(fn, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("attn_backends measures CUDA kernels: no CUDA device here")
    torch.manual_seed(0)
    b, s, h, kv, d = a.seqs, a.seq_len, a.heads, a.kv_heads, a.head_dim

    def proj(heads):  # a [B, S, heads, D] projection viewed as [B, heads, S, D], as transformers does
        return torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    q, k, v = proj(h), proj(kv), proj(kv)
    flops = 4 * b * h * s * s * d / 2
    ref = None
    for name, fn in backends(q, k, v, h // kv).items():
        try:
            for _ in range(a.warmup):
                o = fn()
            times = timed(fn, a.reps)
        except Exception as e:  # the backend does not take this shape: report it, go on
            print(json.dumps({"backend": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
            continue
        o = o.float()
        if ref is None:
            ref = o
        med = statistics.median(times)
        print(json.dumps({"backend": name, "shape": [b, h, kv, s, d], "ms": 1e3 * med,
                          "tflops": flops / med / 1e12, "spread": (max(times) - min(times)) / med,
                          "max_abs_err_vs_first": (o - ref).abs().max().item(),
                          "rel_norm_err_vs_first": ((o - ref).norm() / ref.norm()).item()}), flush=True)


if __name__ == "__main__":
    main()
