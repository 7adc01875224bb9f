"""Drafter-only step throughput at a real shape, without a target (random features), for comparing
attention implementations and optimizer settings on one GPU.

    python -m tests.benchmarks.bench_drafter --shape qwen3-8b --attn-impl flex [--profile 3 --trace t.json]

From the repository root, with PYTHONPATH=trainer:kernels:module_utils (a benchmark, not part of the trainer package).

One step = what `Trainer.micro_batch` does for one micro-batch (anchors, blocks, drafter forward
under bf16 autocast, soft-label loss, backward), then grad clipping and the AdamW update. Anchors
are re-drawn every step, so the context length changes from step to step as in training. Prints
drafter rows/s (forward + backward, the trainer's `drafter_rows_per_s`), rows/s of the whole step,
peak memory, and how many graphs torch.compile built (the flex path should build one per shape
bucket, not one per step). `--profile N` adds a table of GPU time by kind over N more steps.

`--repeats R` times the steps R times in one process and prints the median and spread of the rows/s
over the repeats, with the host time each step spends preparing its micro-batch before the GPU gets
work (`prep_ms`, median and max: anchors, blocks, flex layouts, as `Trainer.prepare` builds them).
`--prefetch` prepares step n+1's right after step n is launched, while it runs on the GPU, as the
trainer does, so that time leaves the critical path (the profiled steps too). Step n+1 is queued before
step n's statistics are read, as the trainer does on CUDA (`Trainer.LAUNCH_AHEAD`), unless
`--no-launch-ahead`.
"""

import argparse
import bisect
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch
from flashfleet_trainer.attention import flex_layouts, resolve_attn_impl
from flashfleet_trainer.data import build_blocks, sample_anchors
from flashfleet_trainer.dflash2 import selector_loss
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, drafter_hidden, gather_rows
from flashfleet_trainer.loss import drafter_loss, get_loss_fn
from flashfleet_trainer.optim import adamw, clipped_step
from flashfleet_trainer.shapes import SHAPES
from flashfleet_trainer.target import default_target_layers
from flashfleet_trainer.trainer import DeviceSpan, Prepared


def compiled_graphs() -> int:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return -1
    return int(counters["stats"]["unique_graphs"])


def step_flops(cfg: DrafterConfig, blocks, vocab: int) -> dict:
    """The useful FLOPs of one micro-batch's forward + backward (teraFLOP), by part: the layers'
    GEMMs on the block rows (forward, input and weight gradients), the context's (fc: forward and
    weight gradient, the features take none; K/V in every layer), the loss's three N x d x V GEMMs
    on the predicted rows, and attention (QK and PV over the entries each row may see, backward
    2.5x the forward). Tiles that flex computes but masks, elementwise work and the optimizer are
    not counted: rate = these FLOPs over the forward + backward time."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv, n_feat = cfg.num_attention_heads, cfg.num_key_value_heads, len(cfg.target_layer_ids)
    seq, anchor = blocks.seq.long(), blocks.anchor.long()
    n, b = blocks.input_ids.shape
    t = int(sum(int(anchor[seq == s].max()) for s in seq.unique()))  # the context: positions < last anchor
    layer = h * (2 * nh * d + 2 * nkv * d + 3 * i)
    out = {"layers": 6 * n * b * layer * cfg.num_hidden_layers,
           "context": 4 * t * n_feat * h * h + 6 * t * cfg.num_hidden_layers * h * 2 * nkv * d,
           "loss": 6 * n * (b - 1) * h * vocab}
    k = torch.arange(b)[None, :]
    attn = 0
    for kind in cfg.layer_types:
        w = cfg.sliding_window if kind == "sliding_attention" else None
        p = anchor[:, None] + k
        ctx = anchor[:, None] - (p - w + 1).clamp(min=0).clamp(max=anchor[:, None]) if w else anchor[:, None] + 0 * k
        own = torch.minimum(k + 1, torch.tensor(w)) if w else torch.full_like(k, b)
        attn += int((ctx + own).sum()) * nh * d * 4 * 3.5
    out["attention"] = attn
    return {key: v / 1e12 for key, v in out.items()}


def drafter_config(shape: str, vocab: int, layers: int, block_size: int, kind: str = "dflash") -> DrafterConfig:
    """The drafter of a published target's shape (random weights: only the widths matter here);
    `kind` dflash2: with DFlash 2's convolutions and selector at their default settings."""
    widths = dict(SHAPES[shape])
    tcfg = SimpleNamespace(vocab_size=vocab, rms_norm_eps=1e-6, rope_parameters={"rope_theta": 1e6}, **widths)
    return DrafterConfig.from_target(tcfg, num_draft_layers=layers,
                                     target_layer_ids=default_target_layers(widths["num_hidden_layers"], layers),
                                     block_size=block_size, mask_token_id=vocab - 1, drafter_kind=kind)


class Bench:
    def __init__(self, a):
        self.a = a
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.cfg = drafter_config(a.shape, a.vocab, a.layers, a.block_size, a.drafter_kind)
        layers = self.cfg.target_layer_ids
        torch.manual_seed(0)
        self.drafter = DFlashDrafter(self.cfg).to(self.dev)
        self.opt = adamw(self.drafter.parameters(), 1e-4, 0.01, self.dev,
                         fused={"auto": None, "on": True, "off": False}[a.fused_adamw])
        dt = torch.bfloat16 if self.dev == "cuda" else torch.float32
        h, n = self.cfg.hidden_size, len(layers)
        g = torch.Generator(device=self.dev).manual_seed(0)
        self.embed = (torch.randn(a.vocab, h, device=self.dev, generator=g) * 0.02).to(dt)
        self.head = (torch.randn(a.vocab, h, device=self.dev, generator=g) * 0.02).to(dt)
        self.feats = torch.randn(a.seqs, a.seq_len, n * h, device=self.dev, generator=g).to(dt)
        self.last = torch.randn(a.seqs, a.seq_len, h, device=self.dev, generator=g).to(dt)
        rng = np.random.default_rng(0)
        self.tokens = [rng.integers(0, a.vocab - 1, size=a.seq_len) for _ in range(a.seqs)]
        self.masks = [np.ones(a.seq_len, dtype=np.int64) for _ in range(a.seqs)]
        self.loss_fn, self.loss_impl = get_loss_fn(a.loss_impl, teacher_fp8=a.teacher_fp8)
        self.attn_impl = resolve_attn_impl(a.attn_impl, self.dev)

    def sync(self):
        if self.dev == "cuda":
            torch.cuda.synchronize()

    def prepare(self, i) -> Prepared:
        """Step i's micro-batch, as the trainer prepares it: anchors, blocks, the flex layouts and the
        teacher's positions, pinned and the attention queued on CUDA (and the generator the forward
        goes on with)."""
        gen = torch.Generator().manual_seed(1000 + i)
        anchors = sample_anchors(self.masks, self.a.anchors, gen)
        blocks = build_blocks(self.tokens, self.masks, anchors, self.a.block_size, self.cfg.mask_token_id)
        p = Prepared((0, i), gen, blocks, tpos=torch.minimum(blocks.teacher_pos, torch.tensor(self.a.seq_len - 1)))
        if self.attn_impl == "flex":
            p.layouts = flex_layouts(self.cfg, blocks)
        return p.pin().to_device(self.dev) if self.dev == "cuda" else p

    def launch(self, i, region=None, prepared=None) -> dict:
        """Queue one micro-batch + optimizer step without waiting for the device; `read` waits.

        ``prepared``: this step's :meth:`prepare`, made while the previous step ran."""
        a = self.a
        region = region or (lambda name: torch.autograd.profiler.record_function(name))
        t0 = time.perf_counter()
        p = prepared if prepared is not None else self.prepare(i)
        blocks = p.blocks
        t_prep = time.perf_counter() - t0
        span = DeviceSpan(self.dev)  # forward + backward, timed on the device as the trainer times it
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.dev == "cuda"):
            with region("drafter_forward"):
                student = drafter_hidden(self.drafter, self.embed, self.feats, blocks, a.noise, p.gen,
                                         attn_impl=self.attn_impl, layouts=p.layouts)
            with region("loss"):
                nb = dict(non_blocking=True)
                teacher = gather_rows(self.last, blocks.seq.to(self.dev, **nb)[:, None], p.tpos.to(self.dev, **nb))
                loss, st = drafter_loss(student, teacher, self.head, blocks.labels.to(self.dev, **nb),
                                        loss_fn=self.loss_fn, weighting=a.weighting, use_soft_labels=True,
                                        kl_temperature=1.0, kl_weight=0.5, host_stats=False, top_k=self.drafter.candidates_k,
                                        ce_target=a.ce_target)
            if self.drafter.selector is not None:  # DFlash 2's term, as Trainer.micro_batch adds it
                with region("selector_loss"):
                    sel, _ = selector_loss(self.drafter.selector, student[:, 1:], self.head, st["labels"],
                                           blocks.predecessors[:, 1:].to(self.dev, **nb), st["weights"][:, 1:],
                                           candidates=st.get("top_ids"))
                    loss = loss + sel
        with region("backward"):
            loss.backward()
        span.stop()  # no wait here, as in the trainer: the optimizer's launches queue behind the backward
        with region("optimizer"):
            gnorm = clipped_step(self.opt, 1.0)
            self.opt.zero_grad(set_to_none=True)
        stats = torch.cat([loss.detach().double().reshape(1), st["ce"].reshape(1), st["kl"].reshape(1),
                           st["correct"].double(), st["count"].double(), gnorm.double().reshape(1)])
        return {"rows": blocks.input_ids.numel(), "blocks": blocks, "t0": t0, "t_prep": t_prep, "span": span, "stats": stats,
                "t_launch": time.perf_counter() - t0}

    def read(self, s) -> tuple:
        """The step's statistics read once, as the trainer reads them; (rows, drafter seconds, step
        seconds, prep seconds, launch seconds: the host's time queueing the step, teraFLOP and their parts:
        `step_flops`). A step's wall time
        runs from its launch, or from the previous read if that came later (launched ahead), so the
        steps' times add up to the wall time."""
        flops = step_flops(self.cfg, s["blocks"], self.a.vocab)  # host work while the GPU still runs the step
        s["stats"].tolist()
        now = time.perf_counter()
        step_s, self.last_read = now - max(s["t0"], self.last_read), now
        return s["rows"], s["t_prep"] + s["span"].seconds(), step_s, s["t_prep"], s["t_launch"], sum(flops.values()), flops

    def steps(self, first, count, region=None):
        """`count` steps from step `first`: with --prefetch each step's micro-batch prepared while the
        step before runs, on the main thread right after that step's launch (as the trainer's
        prepare_next: a worker thread would take the GIL from the launching thread for up to a
        switch interval at a time); with launch-ahead (on unless --no-launch-ahead, as the trainer
        on CUDA) step n+1 queued before step n is read."""
        self.sync()
        self.last_read = time.perf_counter()
        res, queued = [], None
        nxt = self.prepare(first) if self.a.prefetch else None
        for i in range(count):
            s = self.launch(first + i, region, prepared=nxt)
            if self.a.prefetch and i + 1 < count:  # built while this step's kernels run
                nxt = self.prepare(first + i + 1)
            if queued is not None:
                res.append(self.read(queued))
            queued = s
            if not self.a.launch_ahead:
                res.append(self.read(queued))
                queued = None
        if queued is not None:
            res.append(self.read(queued))
        return res

    def run(self):
        a = self.a
        self.steps(0, a.warmup)
        graphs_after_warmup = compiled_graphs()
        if self.dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        rates, first = [], a.warmup
        for _ in range(a.repeats):
            res = self.steps(first, a.steps)
            first += a.steps
            rows = sum(r[0] for r in res)
            rates.append(rows / sum(r[1] for r in res))
        from flashfleet_trainer import attention, drafter

        out = {"attn_impl": self.attn_impl, "fused_elementwise": drafter.FUSE_ELEMENTWISE, "fused_adamw": bool(self.opt.param_groups[0].get("fused")),
               "loss_impl": self.loss_impl, "flex_options": attention.FLEX_KERNEL_OPTIONS, "steps": a.steps, "rows_per_step": rows / a.steps,
               "drafter_rows_per_s": rows / sum(r[1] for r in res), "step_rows_per_s": rows / sum(r[2] for r in res),
               "drafter_ms": 1e3 * sum(r[1] for r in res) / a.steps, "step_ms": 1e3 * sum(r[2] for r in res) / a.steps,
               "graphs_after_warmup": graphs_after_warmup, "graphs_after_steps": compiled_graphs(),
               "prefetch": a.prefetch, "launch_ahead": a.launch_ahead, "prep_ms_median": 1e3 * statistics.median(r[3] for r in res),
               "prep_ms_max": 1e3 * max(r[3] for r in res),
               # the host's time queueing a step: near step_ms, the GPU waits for the host's launches
               "launch_ms_median": 1e3 * statistics.median(r[4] for r in res),
               # useful teraFLOP a step (step_flops) and their rate over the forward + backward time
               "tflop_step": sum(r[5] for r in res) / a.steps,
               "tflop_step_parts": {k: round(sum(r[6][k] for r in res) / a.steps, 2) for k in res[0][6]},
               "tflops_fwd_bwd": sum(r[5] for r in res) / sum(r[1] for r in res),
               "step_ms_spread": (max(r[1] for r in res) - min(r[1] for r in res)) / statistics.median(r[1] for r in res),
               "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if self.dev == "cuda" else None}
        if a.repeats > 1:
            med = statistics.median(rates)
            out["repeats_drafter_rows_per_s"] = [round(r) for r in rates]
            out["repeats_median_rows_per_s"] = med
            out["repeats_spread"] = (max(rates) - min(rates)) / med
        print(json.dumps(out), flush=True)
        if a.profile:
            self.profile(a.profile)
        return out

    def profile(self, n):
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.dev == "cuda" else [])
        with profile(activities=acts) as prof:
            self.steps(10_000, n, region=record_function)  # as timed: prepared ahead with --prefetch
        path = self.a.trace or "/tmp/bench_drafter_trace.json"
        prof.export_chrome_trace(path)
        print(share_table(path), flush=True)
        print(idle_table(path, steps=n), flush=True)
        print(launch_table(path, steps=n), flush=True)
        print(wait_table(path, steps=n), flush=True)


REGIONS = ("drafter_forward", "loss", "optimizer")  # backward kernels run on autograd's thread, outside them
KINDS = (  # (kind, substrings of the kernel name, lower case); first match wins
    ("optimizer (clip + AdamW)", ("adam", "multi_tensor_apply")),
    ("linear attention (fla)", ("gated_delta", "chunk_", "fused_recurrent", "solve_tril", "wy_fast", "l2norm")),
    ("attention", ("flex_attention", "fmha", "flash", "attention", "sdpa")),  # cuDNN's: "..._sdpa_..._fprop_..."
    ("convolution", ("conv", "fprop", "dgrad", "wgrad")),
    ("GEMM", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "splitk", "sm90_", "sm80_", "s16816", "wgmma")),
)


def share_table(trace_path, regions=REGIONS, outside="backward") -> str:
    """GPU kernel time by region (record_function ranges named in `regions` on the GPU timeline;
    `outside` for kernels in none of them) and kind (kernel name)."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    spans = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "gpu_user_annotation"]
    total = sum(k["dur"] for k in kernels) or 1.0
    by, names = {}, {}
    for k in kernels:
        region = next((n for s, t, n in spans if n in regions and s <= k["ts"] < t), outside)
        low = k["name"].lower()
        kind = next((kd for kd, subs in KINDS if any(x in low for x in subs)), "elementwise/other")
        if region == "loss":
            kind = "loss (logits GEMMs + row kernel)"
        elif region == "optimizer":
            kind = "optimizer (clip + AdamW)"
        key = (kind, region)
        by[key] = by.get(key, 0.0) + k["dur"]
        names[k["name"][:90]] = names.get(k["name"][:90], 0.0) + k["dur"]
    lines = [f"GPU kernel time {total / 1e3:.1f} ms over the profiled steps", "| share | kind | region |", "|---:|---|---|"]
    for (kind, region), us in sorted(by.items(), key=lambda x: -x[1]):
        lines.append(f"| {100 * us / total:.1f}% | {kind} | {region} |")
    kinds = {}
    for (kind, _), us in by.items():
        kinds[kind] = kinds.get(kind, 0.0) + us
    lines += ["", "| share | kind |", "|---:|---|"]
    lines += [f"| {100 * us / total:.1f}% | {kind} |" for kind, us in sorted(kinds.items(), key=lambda x: -x[1])]
    lines += ["", "top kernels:"]
    lines += [f"  {100 * us / total:5.1f}%  {name}" for name, us in sorted(names.items(), key=lambda x: -x[1])[:25]]
    return "\n".join(lines)


SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")  # the host waits
ALLOCS = ("cudaMalloc", "cudaFree")  # the caching allocator going to the driver (cudaFree waits for the device)


class Trace:
    """A profiler trace's kernels in time order, and for each kernel the host ops around its launch."""

    def __init__(self, path):
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        self.kernels = sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"])
        runtime = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e]
        self.launch = {e["args"]["correlation"]: e for e in runtime if "correlation" in e.get("args", {})}
        self.syncs = sorted(e["ts"] + e["dur"] for e in runtime if e["name"] in SYNCS)  # when each wait ended
        self.waits = [e for e in runtime if e["name"] in SYNCS + ALLOCS]
        self.ops = {}  # thread -> its ops by start time
        for e in sorted((e for e in events if e.get("cat") == "cpu_op" and "dur" in e), key=lambda e: e["ts"]):
            self.ops.setdefault(e.get("tid"), []).append(e)
        self.starts = {tid: [e["ts"] for e in v] for tid, v in self.ops.items()}
        self.regions = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "gpu_user_annotation"]

    def stack(self, kernel) -> list[str] | None:
        """The host ops running when `kernel` was launched, outermost first (None: launch not traced)."""
        src = self.launch.get(kernel.get("args", {}).get("correlation"))
        return None if src is None else self.ops_at(src)

    def ops_at(self, src) -> list[str]:
        """The host ops running around runtime call `src` on its thread, outermost first."""
        t, tid = src["ts"], src.get("tid")
        mine, at = self.ops.get(tid, []), bisect.bisect_right(self.starts.get(tid, []), t)
        # the enclosing ops start shortly before: a bounded walk back (an op is rarely longer than that)
        return [e["name"] for e in mine[max(0, at - 500):at] if e["ts"] + e["dur"] >= t]

    def region(self, kernel) -> str:
        return next((n for s, t, n in self.regions if s <= kernel["ts"] < t), "outside regions")


def idle_table(trace_path, steps: int = 1, top: int = 12) -> str:
    """Where the GPU waited between the first kernel and the last of the profiled steps: each gap
    before a kernel is put on the host op that launched that kernel (the innermost one around its
    launch) and the region it ran in, and marked `after a sync` when a wait of the host for the GPU
    ended in the gap (then the gap is the host's way from that wait to the next launch)."""
    tr = Trace(trace_path)
    kernels = tr.kernels
    if not kernels:
        return "no GPU kernels in the trace"
    by, idle, end = {}, 0.0, kernels[0]["ts"]
    for k in kernels:
        gap = k["ts"] - end
        if gap > 0:
            idle += gap
            st = tr.stack(k)
            op = "(launch not traced)" if st is None else (st[-1] if st else "(no op)")
            waited = bisect.bisect_left(tr.syncs, k["ts"]) > bisect.bisect_left(tr.syncs, end)  # one ended in the gap
            key = (tr.region(k), op + (" after a sync" if waited else ""))
            n, us = by.get(key, (0, 0.0))
            by[key] = (n + 1, us + gap)
        end = max(end, k["ts"] + k["dur"])
    span = end - kernels[0]["ts"]
    lines = [f"GPU idle {idle / 1e3 / steps:.1f} ms a step of {span / 1e3 / steps:.1f} ms "
             f"({100 * idle / span:.1f}%), from the first kernel to the last of {steps} step(s)",
             "| idle a step | gaps | region | host op that launched the next kernel |", "|---:|---:|---|---|"]
    for (region, op), (n, us) in sorted(by.items(), key=lambda x: -x[1][1])[:top]:
        lines.append(f"| {us / 1e3 / steps:.2f} ms | {n} | {region} | {op[:80]} |")
    return "\n".join(lines)


def wait_table(trace_path, steps: int = 1, top: int = 8) -> str:
    """The host's calls that wait for the GPU or go to the driver for memory (SYNCS, ALLOCS), by the
    host ops around them: a launch that should only queue work shows here when something in it
    reads a result back or reallocates."""
    tr = Trace(trace_path)
    by = {}
    for e in tr.waits:
        st = tr.ops_at(e)
        key = (e["name"], " > ".join(dict.fromkeys([st[0], st[-1]])) if st else "(no op)")
        n, us = by.get(key, (0, 0.0))
        by[key] = (n + 1, us + e["dur"])
    lines = ["host calls that wait or allocate, by the host ops around them",
             "| ms a step | calls | call | outermost > innermost host op |", "|---:|---:|---|---|"]
    for (name, ops), (n, us) in sorted(by.items(), key=lambda x: -x[1][1])[:top]:
        lines.append(f"| {us / 1e3 / steps:.2f} | {n} | {name} | {ops[:90]} |")
    return "\n".join(lines)


def launch_table(trace_path, steps: int = 1, kind: str = "elementwise/other", top: int = 15) -> str:
    """GPU time of one kind of kernel (KINDS) by the host ops that launched it: the outermost and the
    innermost op around each launch (e.g. an autocast cast inside `aten::linear`, or a backward
    node's copy), so the copies and small kernels of a step can be traced to their source."""
    tr = Trace(trace_path)
    by, total = {}, 0.0
    for k in tr.kernels:
        low = k["name"].lower()
        if next((kd for kd, subs in KINDS if any(x in low for x in subs)), "elementwise/other") != kind:
            continue
        st = tr.stack(k)
        ops = "(launch not traced: a compiled kernel)" if st is None else (
            " > ".join(dict.fromkeys([st[0], st[-1]])) if st else "(no op)")
        n, us = by.get((ops, k["name"][:60]), (0, 0.0))
        by[(ops, k["name"][:60])] = (n + 1, us + k["dur"])
        total += k["dur"]
    lines = [f"{kind}: {total / 1e3 / steps:.1f} ms a step of GPU time, by the host ops that launched it",
             "| ms a step | kernels | outermost > innermost host op | kernel |", "|---:|---:|---|---|"]
    for (ops, name), (n, us) in sorted(by.items(), key=lambda x: -x[1][1])[:top]:
        lines.append(f"| {us / 1e3 / steps:.2f} | {n} | {ops[:90]} | {name} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--layers", type=int, default=5, help="draft layers")
    p.add_argument("--drafter-kind", choices=("dflash", "dflash2"), default="dflash")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seqs", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--anchors", type=int, default=512, help="anchors per micro-batch (rows = anchors x block)")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--attn-impl", choices=("auto", "dense", "flex"), default="auto")
    p.add_argument("--fused-adamw", choices=("auto", "on", "off"), default="auto", help="auto: fused on CUDA")
    p.add_argument("--loss-impl", choices=("auto", "triton", "torch"), default="auto")
    p.add_argument("--teacher-fp8", action="store_true", help="the loss's teacher logits from an FP8 GEMM")
    p.add_argument("--ce-target", choices=("data", "target-argmax"), default="data",
                   help="the CE's labels (dflash-train --ce-target); target-argmax takes them from the loss's "
                        "teacher logits (soft labels are on here), data from the batch")
    p.add_argument("--weighting", choices=("streak", "decay", "uniform"), default="streak",
                   help="position weights (streak: computed inside the loss from its own CE)")
    p.add_argument("--eager-elementwise", action="store_true", help="RMSNorm, RoPE and SwiGLU op by op (not compiled)")
    p.add_argument("--flex-options", type=json.loads, default=None,
                   help="JSON kernel_options for flex_attention (attention.FLEX_KERNEL_OPTIONS; default: the trainer's)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="hidden-state noise scale on the context (the trainer's --noise-start/--noise-end)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1, help="time --steps this many times (median and spread)")
    p.add_argument("--prefetch", action="store_true", help="prepare step n+1's anchors and blocks during step n")
    p.add_argument("--no-launch-ahead", dest="launch_ahead", action="store_false",
                   help="read each step's statistics before launching the next (the trainer launches ahead on CUDA)")
    p.add_argument("--profile", type=int, default=0, help="profile this many more steps and print GPU time shares")
    p.add_argument("--trace", default=None, help="where to write the profiler's chrome trace")
    a = p.parse_args(argv)
    if a.eager_elementwise:
        from flashfleet_trainer import drafter

        drafter.FUSE_ELEMENTWISE = False
    if a.flex_options is not None:
        from flashfleet_trainer import attention

        attention.FLEX_KERNEL_OPTIONS = a.flex_options
    Bench(a).run()


if __name__ == "__main__":
    main()
