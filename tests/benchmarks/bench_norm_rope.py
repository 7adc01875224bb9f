"""The drafter's per-head norms, RoPE and placement into flex attention's layout (`norm_rope`), on
one CUDA GPU, at a published shape with a micro-batch built as the trainer builds it.

    python tests/benchmarks/bench_norm_rope.py --shape qwen3-8b

Prints JSON lines. First one attention layer (projections, norms, RoPE, flex attention, output
projection), forward + backward under bf16 autocast, with the norms, RoPE and placement op by op
(the anchor, in the same process) and with the kernel: medians over --reps, their spread
((max - min) / median) and the ratio. Then the kernel alone for q and for K beside V, forward and
forward + backward, at each (rows a program, warps) of the sweep, the module's setting marked.
"""

import argparse
import itertools
import json

import torch
from bench_flex import batch_args, micro_batch, summary  # run as a script: this folder is on the path
from flashfleet_kernels import norm_rope as nr
from flashfleet_trainer.drafter import DraftAttention, rope
from gemm_ceiling import timed  # CUDA events around each call


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_args(p)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args(argv)
    dev = "cuda"
    cfg, sparse = micro_batch(a, 1, dev)
    torch.manual_seed(0)
    layer = DraftAttention(cfg, cfg.layer_types[0]).to(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    h = cfg.hidden_size
    x = torch.randn(sparse.m, h, device=dev, generator=g, dtype=torch.bfloat16).requires_grad_()
    ctx = torch.randn(sparse.t, h, device=dev, generator=g, dtype=torch.bfloat16).requires_grad_()
    rope_q = rope(sparse.block_pos, cfg.head_dim, cfg.rope_theta)
    rope_kv = rope(torch.cat([sparse.ctx_pos, sparse.block_pos]), cfg.head_dim, cfg.rope_theta)
    dout = torch.randn(sparse.m, h, device=dev, generator=g, dtype=torch.bfloat16)
    print(json.dumps({"shape": a.shape, "rows": sparse.m, "context": sparse.t, "q_len": sparse.q_len,
                      "kv_len": sparse.kv_len, "heads": [layer.nh, layer.nkv, layer.d],
                      "device": torch.cuda.get_device_name()}), flush=True)

    def layer_step():
        for t in (x, ctx, *layer.parameters()):
            t.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x, ctx, rope_q, rope_kv, sparse)
        out.backward(dout)

    base, chosen = {}, DraftAttention._placed_by_kernel
    for kernel in (False, True):
        DraftAttention._placed_by_kernel = (lambda self, x, k=kernel: k)
        for _ in range(a.warmup):
            layer_step()
        ms, spread = summary(timed(layer_step, a.reps), 4)
        base.setdefault("ms", ms)
        print(json.dumps({"what": "attention layer, forward + backward", "norm_rope_kernel": kernel, "ms": ms,
                          "spread": spread, "ratio_to_op_by_op": round(ms / base["ms"], 3)}), flush=True)
    DraftAttention._placed_by_kernel = chosen

    nkv, d = layer.nkv, layer.d
    qx = torch.randn(sparse.m, layer.nh, d, device=dev, generator=g, dtype=torch.bfloat16).requires_grad_()
    kvx = torch.randn(sparse.t + sparse.m, 2 * nkv, d, device=dev, generator=g,
                      dtype=torch.bfloat16).requires_grad_()
    w = torch.ones(d, device=dev, requires_grad=True)
    calls = {"q": lambda: nr.norm_rope(qx, w, *rope_q, 1e-6, parts=(layer.nh,), normed=layer.nh,
                                       length=sparse.q_len, split=sparse.m),
             "k beside v": lambda: nr.norm_rope(kvx, w, *rope_kv, 1e-6, parts=(nkv, nkv), normed=nkv,
                                                length=sparse.kv_len, split=sparse.t, shift=sparse.t_pad - sparse.t)}
    setting = (nr._BLOCK_R, nr._NUM_WARPS)
    for (rows, warps), (name, call) in itertools.product(itertools.product((8, 16, 32, 64), (2, 4, 8)), calls.items()):
        nr._BLOCK_R, nr._NUM_WARPS = rows, warps
        grads = [torch.randn_like(o) for o in call()]

        def fwd(call=call):
            with torch.no_grad():
                call()

        def fwd_bwd(call=call, grads=grads):
            torch.autograd.backward(call(), grads)

        for _ in range(a.warmup):
            fwd_bwd()
        row = {"what": f"norm_rope, {name}", "rows_a_program": rows, "warps": warps, "setting": (rows, warps) == setting}
        row["fwd_ms"], row["fwd_spread"] = summary(timed(fwd, a.reps), 4)
        row["fwd_bwd_ms"], row["fwd_bwd_spread"] = summary(timed(fwd_bwd, a.reps), 4)
        print(json.dumps(row), flush=True)
    nr._BLOCK_R, nr._NUM_WARPS = setting


if __name__ == "__main__":
    main()
