"""Benchmark: forward+backward time and peak extra memory of the drafter loss on one CUDA GPU.

    python -m tests.benchmarks.bench_loss                   # the issue's grid, ours/torch/liger
    python -m tests.benchmarks.bench_loss --n 8192 --v 151936 --breakdown
    python -m tests.benchmarks.bench_loss --sweep           # chunk/block/warps for the default shape

From the repository root, with PYTHONPATH=kernels (a benchmark, not part of the kernels package).

"ours" is the fused Triton path, "torch" the fp32 materializing reference, "eager" the same loss in
plain bf16 torch (materialized logits), and the peers, each when importable: "liger" is Liger-Kernel's
``LigerFusedLinearJSDLoss(beta=0)`` (it has no per-row weights, so it computes a slightly different
loss; it is here for speed and memory); "speculators" is vllm-project/speculators' way (cuBLAS bf16
logits for student and teacher, materialized, then its fused Triton KL kernel, weights applied
outside: compare it with ``--temperature 1 --kl-weight 1``, since it has no temperature and no CE
mixing); "cce" is Cut Cross-Entropy's ``linear_cross_entropy`` (hard-label CE only: compare it with
``--kl-weight 0``). "ours@FILE" times another copy of the fused module (e.g. an older commit's
``distill_loss.py``) as an anchor in the same process. Inputs are bf16, the head is frozen, the
gradient goes to the student hidden states only. Time is the median of ``--reps`` runs after
``--warmup``; "peak" is the maximum memory allocated during one forward+backward above what was
allocated before it (inputs), so it includes the ``[N, d]`` gradient. Rows 0 mod 97 are ignored and
the weights are random in [0, 1), so the per-row-weight code path is what gets timed.

``ours:teacher_fp8=1`` is the fused path with FP8 teacher logits. Its FP8 head is made in the
warm-up and then held, so it is not in "peak": it is printed, with what FP8 costs in numerics
against the bf16 path, on a ``# fp8`` line per shape, on the benchmark's data and on the same data
scaled so that the teacher is peaked (mean top-1 probability 0.5 at T=1; see :func:`fp8_numerics`).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import torch

GiB = 1024**3


def make_inputs(n: int, v: int, d: int, dtype=torch.bfloat16, seed: int = 0, device="cuda", data: str = "flat"):
    """Random inputs. ``data="flat"`` (the default): hidden states and head rows Gaussian, so the
    logits are Gaussian with std ~2.2 and both softmaxes are flat. ``data="prior"``: the same plus a
    token-frequency prior shared by all rows, ``-3 log(1 + v / 16)`` on the logit of token ``v``
    (rarer tokens at higher ids, as in a BPE vocabulary), carried by one hidden-state coordinate set
    to 1 and the head's column for it; its teacher's mean top-1 probability at T=1 is ~0.45. Which
    share of the gradient is negligible, and so what tile skipping can leave out, depends on this."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h_s = torch.randn(n, d, device=device, dtype=dtype, generator=gen)
    h_t = (h_s.float() + 0.5 * torch.randn(n, d, device=device, generator=gen)).to(dtype)
    weight = (torch.randn(v, d, device=device, generator=gen) * d**-0.5 * 2).to(dtype)
    if data == "prior":
        h_s[:, 0] = 1.0
        h_t[:, 0] = 1.0
        weight[:, 0] = (-3.0 * torch.log1p(torch.arange(v, device=device, dtype=torch.float32) / 16)).to(dtype)
    elif data != "flat":
        raise ValueError(f"data must be 'flat' or 'prior', got {data!r}")
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


def _ours_file(path, temperature, kl_weight):
    """The fused path from another copy of distill_loss.py (an anchor: e.g. the previous commit's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("flashfleet_kernels._anchor_distill_loss", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(h_s, h_t, weight, labels, row_weights):
        return mod.triton_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights,
                                                    temperature=temperature, kl_weight=kl_weight)
    return run


def _eager(temperature, kl_weight):
    """The loss in plain bf16 torch: both logits materialized, softmaxes in fp32 by autograd."""
    def run(h_s, h_t, weight, labels, row_weights):
        z_s = h_s @ weight.t()
        valid = labels != -100
        w = torch.where(valid, row_weights, 0.0)
        row = torch.zeros_like(w)
        if kl_weight != 1:
            ce = torch.nn.functional.cross_entropy(z_s.float(), labels, ignore_index=-100, reduction="none")
            row = row + (1 - kl_weight) * ce
        if kl_weight != 0:
            with torch.no_grad():
                log_p = torch.log_softmax((h_t @ weight.t()).float() / temperature, -1)
            log_q = torch.log_softmax(z_s.float() / temperature, -1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1) * temperature**2
            row = row + kl_weight * kl
        return (w * row).sum() / w.sum()
    return run


def _speculators(temperature, kl_weight):
    """speculators 0.9.0's fused KL kernel on materialized bf16 logits; weights applied outside.

    ``speculators/__init__.py`` imports its whole model stack (pydantic, transformers, datasets ...);
    the loss module needs only torch, triton and one helper, so it is loaded on its own with that
    helper stubbed (no Ascend NPU here)."""
    import importlib.util
    import pathlib
    import types

    if temperature != 1.0 or kl_weight != 1.0:
        raise ImportError("speculators has no temperature and no CE mixing: use --temperature 1 --kl-weight 1")
    spec = importlib.util.find_spec("speculators")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("speculators is not installed")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    util = types.ModuleType("speculators.utils.util")
    util.is_npu_available = lambda: False
    sys.modules.setdefault("speculators", types.ModuleType("speculators"))
    sys.modules.setdefault("speculators.utils", types.ModuleType("speculators.utils"))
    sys.modules["speculators.utils.util"] = util
    fspec = importlib.util.spec_from_file_location("speculators.losses.fused", root / "losses" / "fused.py")
    fused = importlib.util.module_from_spec(fspec)
    fspec.loader.exec_module(fused)

    def run(h_s, h_t, weight, labels, row_weights):
        z_s = h_s @ weight.t()
        with torch.no_grad():
            z_t = h_t @ weight.t()
        kl = fused.fused_kl_div_loss(z_s[None], z_t[None]).reshape(-1)
        w = torch.where(labels != -100, row_weights, 0.0)
        return (w * kl).sum() / w.sum()
    return run


def _cce(temperature, kl_weight):
    from cut_cross_entropy import linear_cross_entropy

    if kl_weight != 0:
        raise ImportError("Cut Cross-Entropy is CE only: use --kl-weight 0")

    def run(h_s, h_t, weight, labels, row_weights):
        return linear_cross_entropy(h_s, weight, labels, ignore_index=-100)
    return run


def _liger(temperature, kl_weight):
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=1.0 - kl_weight, weight_soft_loss=kl_weight,
                                      beta=0.0, temperature=temperature)

    def run(h_s, h_t, weight, labels, row_weights):
        return loss_fn(h_s, weight, h_t, weight, labels)
    return run


def measure(fn, inputs, reps: int, warmup: int):
    """Median fwd+bwd milliseconds and peak extra GiB, or the reason it could not run. The spread of
    the timed runs, (max - min) / median, is kept in ``measure.last_spread``."""
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
        med = statistics.median(times)
        measure.last_spread = (max(times) - min(times)) / med
        return med, peak
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
              ignore_index: int = -100, **knobs):
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
    logits = "student logits (GEMM)"
    if kl_weight != 0:
        logits = "student bf16 + teacher FP8 logits" if knobs.get("teacher_fp8") else "student+teacher logits (2 GEMMs)"
    names = [logits, "row kernel", "grad GEMM"]
    phases = dict.fromkeys(names, 0.0)
    chunk = None
    for rnd in range(reps + 1):  # round 0 is warm-up
        loop = dl.ChunkLoop(h_s, h_t, weight, labels, row_weights, temperature=float(temperature),
                            kl_weight=float(kl_weight), ignore_index=ignore_index, chunk_size=chunk_size,
                            row_group=row_group, need_grad_h=True, need_grad_w=False, **knobs)
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


def skip_stats(inputs, temperature, kl_weight, **knobs) -> str:
    """One forward+backward of the fused loss with its skip report, and the gradient's relative error
    against the same loss with skipping off."""
    from flashfleet_kernels.distill_loss import triton_fused_linear_distill_loss

    grads, rep = [], {}
    for skip in (True, False):
        h_s = inputs[0].detach().clone().requires_grad_()
        kw = {**knobs, "skip_tiles": skip}
        triton_fused_linear_distill_loss(h_s, *inputs[1:], temperature=temperature, kl_weight=kl_weight,
                                         skip_report=rep if not grads else None, **kw).backward()
        grads.append(h_s.grad.float())
    rel = ((grads[0] - grads[1]).norm() / grads[1].norm()).item()
    pairs = max(rep["pairs"], 1)
    return (f"skip_mass {rep['skip_mass']:.2e}: {rep['pairs_skipped'] / pairs:.1%} of (row block, tile) pairs "
            f"skipped in {rep['chunks_skipping']} chunks, max row share {rep['max_row_fraction'].item():.2e}, "
            f"mass share {rep['mass_fraction'].item():.2e}; grad vs no skipping rel err {rel:.2e}")


def peaked_scale(h_t, weight, top1=0.5, rows=256):
    """The factor on the hidden states that makes the teacher's mean top-1 probability at T=1 equal
    ``top1`` (on the first ``rows`` rows), found by bisection on fp32 logits."""
    z = h_t[:rows].float() @ weight.float().t()
    lo, hi = 0.0, 1.0
    while torch.softmax(hi * z, -1).amax(-1).mean() < top1:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if torch.softmax(mid * z, -1).amax(-1).mean() < top1 else (lo, mid)
    return (lo + hi) / 2


def fp8_numerics(inputs, temperature, kl_weight, rows=1024, **knobs):
    """What ``teacher_fp8`` costs in numerics on these inputs, against the default path.

    Whole loss (the loss's own :class:`ChunkLoop`, gradient to h_s): relative error of the loss and
    of its KL term, cosine similarity and relative error (norm) of the gradient. Teacher logits of
    the first ``rows`` rows against fp32 logits: the largest error of the FP8 and of the bf16 GEMM,
    the logits' standard deviation, the rows whose teacher top-1 token is unchanged, and the mean
    ``KL(p_fp32 || p)`` at T of each. Also the FP8 head's size and the time to make it once.
    """
    from flashfleet_kernels import distill_loss as dl

    h_s, h_t, weight, labels, row_weights = dl.prepare_inputs(
        inputs[0].detach(), inputs[1], inputs[2].detach(), inputs[3], inputs[4], temperature=temperature,
        kl_weight=kl_weight)
    out = {}
    for fp8 in (False, True):
        loop = dl.ChunkLoop(h_s, h_t, weight, labels, row_weights, temperature=float(temperature),
                            kl_weight=float(kl_weight), ignore_index=-100, teacher_fp8=fp8, **knobs)
        loop.run()
        loss, _ = loop.loss()
        out[fp8] = (loss.item(), (loop.scale * loop.row_kl).sum().item(), loop.grad_h.float().flatten())
        del loop
    (loss_b, kl_b, g_b), (loss_f, kl_f, g_f) = out[False], out[True]
    res = dict(loss_rel=abs(loss_f - loss_b) / abs(loss_b), kl_rel=abs(kl_f - kl_b) / abs(kl_b),
               grad_cos=torch.nn.functional.cosine_similarity(g_f, g_b, dim=0).item(),
               grad_rel=((g_f - g_b).norm() / g_b.norm()).item())
    del g_b, g_f

    dl.clear_fp8_heads()
    watch = _Stopwatch(weight.device)
    watch.mark()
    w8, w_scale = dl.fp8_head(weight)
    watch.mark()
    res["head_ms"], res["head_gib"] = watch.laps_ms()[0], (w8.numel() + 4 * w_scale.numel()) / GiB
    ht = h_t[:rows]
    z_f = dl.fp8_teacher_logits(ht, (w8, w_scale), weight.shape[0], weight.dtype).float()
    z_b = (ht @ weight.t()).float()
    z_32 = ht.float() @ weight.float().t()
    log_p32 = torch.log_softmax(z_32 / temperature, -1)
    for name, z in (("fp8", z_f), ("bf16", z_b)):
        res[f"{name}_max_err"] = (z - z_32).abs().max().item()
        res[f"{name}_top1"] = (z.argmax(-1) == z_32.argmax(-1)).float().mean().item()
        log_p = torch.log_softmax(z / temperature, -1)
        res[f"{name}_kl"] = (log_p32.exp() * (log_p32 - log_p)).sum(-1).mean().item()
    res["logit_std"] = z_32.std().item()
    res["fp8_vs_bf16_max"] = (z_f - z_b).abs().max().item()
    return res


def format_fp8_numerics(r) -> str:
    return (f"loss rel err {r['loss_rel']:.2e}, KL term rel err {r['kl_rel']:.2e}, grad cosine "
            f"{r['grad_cos']:.6f} (rel err {r['grad_rel']:.2e}); teacher logits (std {r['logit_std']:.2f}): "
            f"max |fp8 - bf16| {r['fp8_vs_bf16_max']:.3f}, max |err| vs fp32 fp8 {r['fp8_max_err']:.3f} / bf16 "
            f"{r['bf16_max_err']:.3f}, top-1 kept fp8 {r['fp8_top1']:.1%} / bf16 {r['bf16_top1']:.1%}, "
            f"mean KL(p_fp32 || p) at T fp8 {r['fp8_kl']:.2e} / bf16 {r['bf16_kl']:.2e}; FP8 head "
            f"{r['head_gib']:.2f} GiB held, made in {r['head_ms']:.1f} ms")


def sweep(args, anchors):
    """Row-kernel launch variants (block, warps, segment), chunk sizes and cuBLASLt, at --n[0]; each
    variant's whole fwd+bwd and its row-kernel phase, beside the anchors (--impls) timed in between."""
    T, a = args.temperature, args.kl_weight
    variants = [dict(chunk_size=c, block_size=b, num_warps=w, seg_size=s)
                for c in (1024, 768) for b, w, s in ((4096, 8, None), (2048, 4, None), (2048, 8, None),
                                                     (4096, 8, 32768), (2048, 4, 8192), (1024, 4, 8192),
                                                     (2048, 4, 32768), (4096, 16, 38912))]
    for v in args.v:
        inputs = make_inputs(args.n[0], v, args.d)
        for name, fn in anchors:
            ms, peak = measure(fn, inputs, args.reps, args.warmup)
            print(f"sweep N={args.n[0]} V={v} anchor {name}: {ms} ms", flush=True)
            del fn
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            for knobs in variants if lib == "cublas" else variants[:2]:
                fn = _ours(T, a, **knobs)
                ms, peak = measure(fn, inputs, args.reps, args.warmup)
                _, phases = breakdown(inputs, T, a, reps=2, **knobs)
                laps = " / ".join(f"{x:.1f}" for x in phases.values())
                print(f"sweep N={args.n[0]} V={v} {lib} {knobs}: {ms:.1f} ms, {peak:.2f} GiB; phases {laps} ms",
                      flush=True)
        torch.backends.cuda.preferred_blas_library("cublas")
        del inputs
    return 0


def skip_gemm_speed(v=151936, d=5120, rows=1024, reps=20, configs=None):
    """The skipping gradient GEMM (Triton) against cuBLAS on one chunk, ``[rows x v] @ [v x d]`` bf16:
    milliseconds (median of ``reps``) with every tile kept and with a random 25/50/75% of (row block,
    tile) pairs skipped, per launch config ``(BM, TILE, BN, warps, stages, splits)``, ``+ ("tma",)``
    for the variant that loads its tiles through tensor descriptors."""
    from flashfleet_kernels import distill_loss as dl

    gen = torch.Generator(device="cuda").manual_seed(0)
    g = (torch.randn(rows, v, device="cuda", generator=gen) * 1e-3).bfloat16()
    w = (torch.randn(v, d, device="cuda", generator=gen) * 0.03).bfloat16()
    out = torch.empty(rows, d, device="cuda", dtype=torch.bfloat16)

    def timed(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    def launch(cfg, kept, count, part):
        bm, tile, bn, warps, stages, split = cfg[:6]
        grid = (split * -(-rows // bm) * -(-d // bn),)
        if cfg[6:] == ("tma",):
            from triton.tools.tensor_descriptor import TensorDescriptor

            dl._skip_grad_gemm_tma_kernel[grid](
                TensorDescriptor.from_tensor(g, [bm, tile]), TensorDescriptor.from_tensor(w, [tile, bn]), part, kept,
                count, rows, d, kept.shape[1], SPLIT=split, BM=bm, BN=bn, TILE=tile, num_warps=warps,
                num_stages=stages)
            out.copy_(part.sum(0))
            return
        dl._skip_grad_gemm_kernel[grid](g, w, part, kept, count, rows, v, d, g.stride(0), w.stride(0), kept.shape[1],
                                        SPLIT=split, BM=bm, BN=bn, TILE=tile, IEEE=False, num_warps=warps,
                                        num_stages=stages)
        out.copy_(part.sum(0))

    flop = 2 * rows * v * d
    ms = timed(lambda: torch.mm(g, w, out=out))
    print(f"# skip GEMM [{rows} x {v}] @ [{v} x {d}]: cuBLAS {ms:.3f} ms ({flop / ms / 1e9:.0f} TFLOP/s)", flush=True)
    ref = (g.float() @ w.float())
    for cfg in configs or [dl.SKIP_GEMM, (128, 64, 256, 8, 4, 4, "tma"), (128, 64, 256, 8, 3, 4, "tma"),
                           (128, 64, 128, 4, 4, 4, "tma")]:
        bm, tile, bn, warps, stages, split = cfg[:6]
        n_tiles = -(-v // tile)
        blocks = -(-rows // bm)
        part = torch.empty(split, rows, d, device="cuda", dtype=torch.float32)
        line = []
        for skip in (0.0, 0.25, 0.5, 0.75):
            keep = torch.rand(blocks, n_tiles, device="cuda", generator=gen) >= skip
            ranks = torch.arange(n_tiles, device="cuda")
            kept = torch.where(keep, ranks, ranks + n_tiles).sort(1).values.to(torch.int32)
            count = keep.sum(1).to(torch.int32)

            try:
                t = timed(functools.partial(launch, cfg, kept, count, part))
            except Exception as exc:  # a config the compiler cannot fit
                line.append(f"skip {skip:.0%}: failed ({type(exc).__name__})")
                break
            if skip == 0.0:
                err = ((out.float() - ref).norm() / ref.norm()).item()
                line.append(f"all kept {t:.3f} ms ({flop / t / 1e9:.0f} TFLOP/s, rel err vs fp32 {err:.1e})")
            else:
                line.append(f"{skip:.0%} skipped {t:.3f} ms")
        print(f"#   {cfg}: " + "; ".join(line), flush=True)


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
    p.add_argument("--data", choices=("flat", "prior"), default="flat",
                   help="input logits: flat (default) or with a shared token-frequency prior (see make_inputs)")
    p.add_argument("--skip-gemm", action="store_true", help="time the skipping gradient GEMM against cuBLAS")
    p.add_argument("--sweep", action="store_true",
                   help="try chunk sizes / row-kernel blocks, warps and segments / cuBLASLt at --n[0]")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 1

    if args.skip_gemm:
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
        for v in args.v:
            skip_gemm_speed(v=v, d=args.d)
        return 0
    T, a = args.temperature, args.kl_weight
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}, bf16, d={args.d}, T={T}, kl_weight={a}")
    makers = {"ours": lambda: _ours(T, a, chunk_size=args.chunk_size), "torch": lambda: _torch(T, a),
              "eager": lambda: _eager(T, a), "liger": lambda: _liger(T, a),
              "speculators": lambda: _speculators(T, a), "cce": lambda: _cce(T, a)}
    impls = []
    variants = {}  # "ours:..." name -> its knobs, for --breakdown and the FP8 numerics
    for name in args.impls.split(","):
        try:
            if name.startswith("ours@"):
                impls.append((name, _ours_file(name[5:], T, a)))
            elif name.startswith("ours:"):  # ours with knobs, e.g. ours:one_logits_gemm=1+chunk_size=768
                knobs = {k: float(x) if "." in x or "e" in x else int(x)
                         for k, x in (kv.split("=") for kv in name[5:].split("+"))}
                for flag in ("one_logits_gemm", "teacher_fp8", "skip_tiles"):
                    if flag in knobs:
                        knobs[flag] = bool(knobs[flag])
                variants[name] = {"chunk_size": args.chunk_size, **knobs}
                impls.append((name, _ours(T, a, **variants[name])))
            else:
                impls.append((name, makers[name]()))
        except (ImportError, FileNotFoundError) as exc:
            print(f"# {name}: not available ({exc})")

    if args.sweep:
        return sweep(args, impls)

    print("| N | V | impl | fwd+bwd ms (median) | spread | peak extra GiB | matmul TFLOP/s |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for v in args.v:
        for n in args.n:
            inputs = make_inputs(n, v, args.d, data=args.data)
            for name, fn in impls:
                ms, peak = measure(fn, inputs, args.reps, args.warmup)
                if isinstance(ms, str):
                    print(f"| {n:,} | {v:,} | {name} | {ms} | - | - | - |", flush=True)
                    continue
                tflops = matmul_flops(n, v, args.d, a) / (ms * 1e-3) / 1e12
                print(f"| {n:,} | {v:,} | {name} | {ms:.1f} | {measure.last_spread:.1%} | {peak:.2f} | {tflops:.0f} |",
                      flush=True)
            for name, knobs in variants.items():
                if not knobs.get("skip_tiles"):
                    continue
                rep = skip_stats(inputs, T, a, **{k: x for k, x in knobs.items() if k != "chunk_size"})
                print(f"#   skipped {name} N={n} V={v} data={args.data}: {rep}", flush=True)
            if args.breakdown:
                for name, knobs in {"ours": {"chunk_size": args.chunk_size}, **variants}.items():
                    c, phases = breakdown(inputs, T, a, **knobs)
                    parts = ", ".join(f"{k} {ms:.1f} ms" for k, ms in phases.items())
                    print(f"#   breakdown {name} N={n} V={v} chunk={c}: {parts}", flush=True)
            fp8 = next((k for k in variants.values() if k.get("teacher_fp8")), None)
            if fp8 is not None and a != 0:
                knobs = {k: x for k, x in fp8.items() if k != "teacher_fp8"}
                print(f"# fp8 N={n} V={v} benchmark data: {format_fp8_numerics(fp8_numerics(inputs, T, a, **knobs))}",
                      flush=True)
                alpha = peaked_scale(inputs[1], inputs[2])
                peaked = (inputs[0].detach() * alpha, inputs[1] * alpha, *inputs[2:])
                print(f"# fp8 N={n} V={v} peaked teacher (hidden states x {alpha:.2f}): "
                      f"{format_fp8_numerics(fp8_numerics(peaked, T, a, **knobs))}", flush=True)
                del peaked
            del inputs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
