"""One drafter rank: the Trainer (load, train, checkpoint, evaluate) and run_rank around it.

Read top to bottom: the schedules, the data order and device timing, then `Rank` (where a
Trainer sits in the run), then `Trainer`: __init__ (every attribute), setup (load), micro_batch / train_step (one
optimizer step), save / evaluate, train (the loop); then run_rank, which owns the run's files.

One `Trainer` is one drafter rank. With one target and one drafter on the same device it runs
in the `dflash-train` process itself and calls the target in-line (feed.InProcessFeed); otherwise
topology.py starts target worker processes and drafter rank processes, and each rank's Trainer
gets its hidden states from a feed.QueueFeed. The data order does not depend on the topology: an
optimizer step consumes `grad_accum x world` consecutive micro-batches of one global sequence,
micro-batch g going to drafter rank g % world, and a micro-batch's anchors and noise come from a
generator seeded by (seed, epoch, index). So 1 target + 1 drafter with --grad-accum 2 and
2 targets + 2 drafters with --grad-accum 1 train on the same blocks with the same gradients.

Only rank 0 writes status.json, metrics.jsonl, wandb and checkpoints; the other ranks get the
no-op variants (Status.null(), MetricsLog.null()) and a notifier that says nothing.
"""

import collections
import json
import math
import os
import resource
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from flashfleet.contract import layout, messages
from flashfleet.contract import metrics as contract
from flashfleet.plan.settings import RunConfig

from . import checkpoint as ckpt
from . import wandb_compat
from .attention import SparseAttention, flex_layouts, resolve_attn_impl
from .data import Blocks, build_blocks, load_data, pack_epoch, sample_anchors
from .dflash2 import selector_loss
from .drafter import DFlashDrafter, DrafterConfig, drafter_hidden, gather_rows
from .errors import ConfigError, NonFiniteLoss
from .evaluate import eval_wanted, evaluate_drafter
from .feed import Feed, InProcessFeed, wants_final_state
from .loadwatch import LoadWatch
from .loss import IGNORE, acceptance_proxy, drafter_loss, get_loss_fn
from .metrics import MetricsLog, Status, begin_run
from .notify import Notifier
from .optim import adamw, clipped_step
from .preflight import StartFacts
from .target import HiddenStateProducer, load_frozen_io
from .vllm_target import VllmFeed

# ---- schedules -----------------------------------------------------------------------------------

def lr_lambda(total_steps: int, warmup_ratio: float):
    """LR factor: linear warmup over warmup_ratio of the steps, then cosine decay to 0."""
    warmup = max(1, math.ceil(warmup_ratio * total_steps)) if warmup_ratio > 0 else 0

    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def noise_at(step, total, start, end) -> float:
    """Cosine anneal from start (step 0) to end (last step)."""
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, total))))


# ---- the data order ------------------------------------------------------------------------------

def micro_batch_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """Anchors and noise of micro-batch (epoch, index): a function of the data position alone,
    so any rank may process any micro-batch and resume needs no generator state."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0]))


class MicroBatches:
    """The one global sequence of micro-batches: (epoch, index, sequence ids), epoch after epoch."""

    def __init__(self, lengths, args):
        self.lengths, self.args, self._cache = lengths, args, {}

    def epoch(self, e: int) -> list[list[int]]:
        if e not in self._cache:
            a = self.args
            self._cache = {e: pack_epoch(self.lengths, a.seed, e, a.token_budget, a.max_batch_size)}
        return self._cache[e]

    def iterate(self, epoch: int, index: int):
        while True:
            batches = self.epoch(epoch)
            if index >= len(batches):
                epoch, index = epoch + 1, 0
                continue
            yield epoch, index, batches[index]
            index += 1


# ---- device time, memory, optimizer state --------------------------------------------------------

def _peak_mem(device) -> int:
    if str(device).startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class DeviceSpan:
    """Seconds between two points of this process's work on a device, read after a later sync
    without one of its own: CUDA events on the current stream; the wall clock on CPU."""

    def __init__(self, device):
        self.cuda = str(device).startswith("cuda")
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0, self.dt = time.perf_counter(), None

    def stop(self) -> "DeviceSpan":
        if self.cuda:
            self.end.record()
        else:
            self.dt = time.perf_counter() - self.t0
        return self

    def seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1e3
        return self.dt


def load_optimizer_state(opt, saved: dict) -> None:
    """Load a saved optimizer state, keeping this optimizer's update kernel (fused on CUDA, foreach
    on CPU) rather than the saver's: load_state_dict would take the saved groups' flags, and
    the step counters' placement follows them."""
    for g_saved, g_now in zip(saved["param_groups"], opt.param_groups, strict=True):
        for k in ("fused", "foreach", "capturable"):
            if k in g_now:
                g_saved[k] = g_now[k]
    opt.load_state_dict(saved)


@dataclass
class Prepared:
    """A micro-batch's host work: what Trainer.prepare builds, ahead of the micro-batch when it can."""

    key: tuple  # (epoch, index)
    gen: torch.Generator  # its generator, the anchors drawn: the noise comes next, in drafter_hidden
    blocks: Blocks | None  # None: no anchors
    layouts: dict | SparseAttention | None = None  # flex_layouts of the blocks, or (to_device) their attention
    tpos: torch.Tensor | None = None  # [N, B] the teacher's positions (soft labels only)

    def pin(self) -> "Prepared":
        """Its tensors in pinned memory, so their copies to a CUDA device do not wait for the host."""
        pin = lambda t: t.pin_memory() if isinstance(t, torch.Tensor) else t  # noqa: E731
        for k in ("seq", "anchor", "input_ids", "labels", "predecessors"):
            setattr(self.blocks, k, pin(getattr(self.blocks, k)))
        self.tpos = None if self.tpos is None else pin(self.tpos)
        if isinstance(self.layouts, dict):  # (not yet a SparseAttention: that one is on the device)
            self.layouts = {t: {k: pin(v) for k, v in lay.items()} for t, lay in self.layouts.items()}
        return self

    def to_device(self, device) -> "Prepared":
        """Queue the flex layouts' copies and BlockMasks now (`SparseAttention`), behind whatever the
        device still runs: built at the start of the drafter's forward instead, their many small
        kernels each wait for the host's launch (about 3 ms a step at the Qwen3-8B shape)."""
        if isinstance(self.layouts, dict):
            self.layouts = SparseAttention(self.layouts, device)
        return self


@dataclass
class Launched:
    """An optimizer step queued on the device, its statistics not yet read (Trainer.launch_step)."""

    step: int  # the step's number once done (1 for the first)
    t_launch: float  # perf_counter when its launch began
    lr: float
    noise: float
    epoch: float  # the position in epochs after it
    acc: dict  # the host-side sums (Trainer.STEP_SUMS)
    spans: list  # DeviceSpan of each micro-batch's forward + backward
    reduce_span: "DeviceSpan | None"  # the gradient all-reduce (several ranks)
    sums: torch.Tensor  # on the device: [the all-reduced vector..., grad norm]


def shift_labels_late(blocks) -> torch.Tensor:
    """DIAGNOSTIC (Trainer.LABEL_SHIFT): block position k labelled with the token at anchor+k-1
    (position 1 with the anchor itself) instead of anchor+k, where the original has a label. The
    drafter learns these easily (high training accuracy) and is served one position off (tau ~1)."""
    lab = blocks.labels
    early = torch.cat([blocks.input_ids[:, :1], lab[:, 1:-1]], dim=1)
    out = lab.clone()
    out[:, 1:] = torch.where((lab[:, 1:] == IGNORE) | (early == IGNORE), IGNORE, early)
    return out


# ---- one drafter rank ------------------------------------------------------------------------

@dataclass
class Rank:
    """Where one Trainer sits in the run. The defaults are the single-process run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    n_targets: int = 1  # target workers in the whole run, or the one in-process (for rates and idle fractions)
    notifier: Notifier = field(default_factory=Notifier)  # sd_notify, a forwarder to the main process, or null
    stop_event: object = None  # set by the node's main process on SIGTERM
    main_pid: int = field(default_factory=os.getpid)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Trainer:
    """One drafter rank. __init__ only records where it sits; setup() loads (target or frozen I/O,
    data, drafter, optimizer, checkpoint); train() runs the loop."""

    def __init__(self, args: RunConfig, facts: StartFacts, status: Status, log=print, rank: Rank | None = None,
                 feed: Feed | None = None):
        self.args, self.facts, self.status, self.log = args, facts, status, log
        self.r = rank or Rank()
        self.dev = facts.drafter_devices[self.r.local_rank]
        self.dcfg = facts.drafter_config
        self.want_last = wants_final_state(args.loss)  # the loss reads the target's final state
        self.per_step = args.grad_accum * self.r.world  # micro-batches per optimizer step, all ranks together
        self.out = Path(args.output_dir)
        self.ckpt_root = self.out / layout.CHECKPOINTS
        # Stopping: what this process saw, and what all ranks decided together (the same on every rank).
        self.stop_local = False  # SIGTERM (or the node's stop event) seen by this process
        self.stop_requested = False  # stop after this step
        # Position in the global sequence of micro-batches; resume() may move it.
        self.step = 0
        self.epoch, self.batch_index = 0, 0
        # Set by setup(). feed=None means the target is loaded in this process (InProcessFeed).
        self.feed = feed
        self.producer = None  # the target in this process, if any (evaluation borrows one when there is none)
        self.embed_weight = self.lm_head_weight = None  # the target's frozen embedding and LM head
        self.data = self.stream = None  # the data set, and its MicroBatches
        self.batches_per_epoch = self.total_steps = 0
        self.drafter = self.opt = self.sched = None  # fp32 master weights, AdamW, LR schedule
        self.loss_fn, self.loss_impl, self.attn_impl = None, None, None  # the resolved --loss-impl, --attn-impl
        self.upcoming = None  # iterator over the global sequence from the current position
        self.ahead = collections.deque()  # items taken from `upcoming` to look ahead, not yet trained on
        self.prepared = None  # the host work of this rank's next micro-batch, done ahead (Prepared)
        self.eval_spent_s = 0.0  # what interval evaluations have cost the training so far (seconds; interval_eval)
        self.eval_pending = None  # (step, weights, recent) of the interval evaluation a target worker runs
        self.recent = []  # (accept_proxy, acc at position 1) of the newest training steps (the guard's window)
        self._last_read = 0.0  # perf_counter of the newest read_step

    def request_stop(self, *_):
        """SIGTERM: finish the current step (and one already queued behind it), save, exit 0."""
        if not self.stop_local:
            self.stop_local = True
            if self.r.is_main:
                self.r.notifier.stopping()
            self.log("stop requested: finishing the current step, then saving")

    def _local_stop(self) -> bool:
        return self.stop_local or (self.r.stop_event is not None and self.r.stop_event.is_set())

    # ---- setup -------------------------------------------------------------------------------
    def setup(self):
        a, p = self.args, self.facts
        if self.dev.startswith("cuda"):
            torch.cuda.set_device(self.dev)
        if self.feed is None and a.target_servers:  # the target runs in vLLM (vllm_target)
            self.feed = VllmFeed.for_training(a, p, self.dev, self.log)
        elif self.feed is None:
            self.r.notifier.status("loading target")
            with LoadWatch(a.target_model, self.r.notifier, self.status):  # progress; start timeout extended
                self.feed = InProcessFeed(a, p, self.dev, lambda s: (self.r.notifier.status(s), self.log(s)))
            self.producer = self.feed.producer
        else:  # a queue feed (with --drafter-serves-target it holds this rank's own replica), or vLLM's
            self.producer = getattr(self.feed, "local", None)
        if self.producer is not None:  # the target's embedding and LM head, from the replica in this process
            self.embed_weight, self.lm_head_weight = self.producer.embed_weight, self.producer.lm_head_weight
        else:
            dtype = torch.float32 if self.dev == "cpu" else torch.bfloat16
            self.embed_weight, self.lm_head_weight = load_frozen_io(a.target_model, self.dev, dtype)
        self.r.notifier.status("loading data")
        self.data = load_data(a.data_dir, a.max_seq_len, p.vocab_size)
        self.stream = MicroBatches(self.data.lengths, a)
        self.batches_per_epoch = len(self.stream.epoch(0))
        by_epochs = max(1, int(a.epochs * self.batches_per_epoch) // self.per_step)
        self.total_steps = a.max_steps if a.max_steps else by_epochs
        torch.manual_seed(a.seed)  # the same initial drafter on every rank and in every topology
        self.drafter = DFlashDrafter(self.dcfg).to(self.dev)  # fp32 master weights
        self.opt = adamw(self.drafter.parameters(), a.lr, a.weight_decay, self.dev)
        self.attn_impl = resolve_attn_impl(a.attn_impl, self.dev)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(self.total_steps, a.warmup_ratio))
        self.loss_fn, self.loss_impl = get_loss_fn(a.loss_impl, teacher_fp8=a.teacher_fp8)
        if self.resume() is None and a.init_from:
            self.init_from(a.init_from)
        elif a.init_from:
            self.log(f"--init-from {a.init_from} ignored: resumed from a checkpoint of this run")
        self.upcoming = self.stream.iterate(self.epoch, self.batch_index)
        self.ahead.clear()
        self.prepared = None
        self.feed.start(self.data, self._mine(self.stream.iterate(self.epoch, self.batch_index)))
        n_params = sum(q.numel() for q in self.drafter.parameters())
        self.log(f"drafter: {n_params / 1e6:.2f}M trainable params, {self.dcfg.num_hidden_layers} layers, block "
                 f"{a.block_size}; {len(self.data)} sequences, {self.batches_per_epoch} micro-batches/epoch, "
                 f"{self.total_steps} steps; loss impl {self.loss_impl}; attention {self.attn_impl}; rank {self.r.rank}/{self.r.world} on "
                 f"{self.dev}; starting at step {self.step}")

    def _mine(self, it):
        """This rank's share of the global sequence from the current position (for prefetching)."""
        g = self.step * self.per_step
        for item in it:
            if g % self.r.world == self.r.rank:
                yield item
            g += 1

    def resume(self) -> Path | None:
        """Load the checkpoint --resume names (auto: the newest complete one); the path, or None."""
        a = self.args
        found = ckpt.resume_checkpoint(a.resume, self.ckpt_root, self.facts.checkpoints)  # preflight verified it
        if found is None:
            return None
        path, (weights, cfg, state) = found
        # preflight refused a different drafter already; kept here for callers that skip it
        diff = ckpt.drafter_differences(self.dcfg.to_dict(), DrafterConfig.from_dict(cfg).to_dict())
        if diff:
            raise ConfigError(f"checkpoint {path} has a different drafter ({', '.join(diff)} differ)",
                              "use a new --output-dir or --resume never")
        self.drafter.load_state_dict(weights)
        load_optimizer_state(self.opt, state["optimizer"])
        # The LR is this run's schedule at the resumed step, never the checkpoint's: a longer
        # --max-steps (or another --lr) on resume would otherwise train one step at the old one's.
        for group in self.opt.param_groups:
            group["initial_lr"] = a.lr
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(self.total_steps, a.warmup_ratio),
                                                       last_epoch=state["step"] - 1)
        if state.get("total_steps") not in (None, self.total_steps):
            self.log(f"schedule: {self.total_steps} steps now, {state['total_steps']} when {path.name} was saved: the "
                     f"learning rate follows the new schedule from step {state['step']} "
                     f"({self.sched.get_last_lr()[0]:.3g})")
        torch.set_rng_state(state["rng"]["torch"])
        ckpt.restore_cuda_rng(state["rng"].get("cuda"))
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], state["batch_index"]
        self.status.update(newest_checkpoint=str(path))
        self.log(f"resumed from {path} (step {self.step}, epoch {self.epoch}, micro-batch {self.batch_index})")
        return path

    def init_from(self, path):
        """--init-from: the weights of a DFlash drafter directory, loaded before the first step (when
        no checkpoint was resumed); the same on every rank. A different drafter is a ConfigError."""
        from .export import check_init_from, load_dflash_dir

        check_init_from(path, self.dcfg)
        _cfg, state = load_dflash_dir(path)
        self.drafter.load_state_dict(state)
        self.log(f"initialised the drafter from {path} ({len(state)} tensors)")

    def epoch_float(self) -> float:
        return self.epoch + self.batch_index / max(1, self.batches_per_epoch)

    # ---- one optimizer step ------------------------------------------------------------------
    PREPARE_AHEAD = True  # False: each micro-batch's host work in-line (the reference the tests compare with)

    def prepare(self, epoch, index, idx) -> Prepared:
        """The host work of micro-batch (epoch, index): anchors, blocks, the flex layouts and the
        teacher's positions. It needs no features, so train_step runs it for the next micro-batch
        while this one's kernels run; pinned, so their copies to the device do not wait."""
        a = self.args
        seqs, masks = zip(*(self.data.seq(i) for i in idx), strict=True)
        gen = micro_batch_generator(a.seed, epoch, index)
        anchors = sample_anchors(list(masks), a.max_anchors, gen)
        if sum(len(x) for x in anchors) == 0:
            return Prepared((epoch, index), gen, None)  # nothing supervised in this micro-batch
        blocks = build_blocks(list(seqs), list(masks), anchors, a.block_size, self.dcfg.mask_token_id)
        if self.LABEL_SHIFT:
            blocks.labels = shift_labels_late(blocks)
        p = Prepared((epoch, index), gen, blocks)
        if self.attn_impl == "flex":
            p.layouts = flex_layouts(self.dcfg, blocks)
        if self.want_last:  # the lengths the feed will report: those of the sequences
            lengths = torch.tensor([len(x) for x in seqs])
            p.tpos = torch.minimum(blocks.teacher_pos, (lengths[blocks.seq] - 1)[:, None])
        return p.pin() if self.dev.startswith("cuda") else p

    def micro_batch(self, epoch, index, idx, noise) -> dict | None:
        """Forward and backward of one micro-batch; returns its statistics (None: no anchors)."""
        a = self.args
        f = self.feed.get((epoch, index), idx)  # the feeds leave the drafter's device idle
        span = DeviceSpan(self.dev)
        p, self.prepared = self.prepared, None
        if p is None or p.key != (epoch, index):
            p = self.prepare(epoch, index, idx)
        out = {"tokens": int(f.lengths.sum()), "target_s": f.target_s, "wait_s": f.wait_s, "serve_s": f.serve_s,
               "worker_s": 0.0 if f.by_drafter else f.target_s, "occupancy": f.occupancy}
        if p.blocks is None:
            return out  # nothing supervised in this micro-batch
        blocks = p.blocks
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.dev.startswith("cuda")):
            student = drafter_hidden(self.drafter, self.embed_weight, f.feats, blocks, noise, p.gen,
                                     attn_impl=self.attn_impl, layouts=p.layouts)
            teacher = None
            if self.want_last:
                teacher = gather_rows(f.last, blocks.seq.to(self.dev, non_blocking=True)[:, None],
                                      p.tpos.to(self.dev, non_blocking=True))
            loss, st = drafter_loss(student, teacher, self.lm_head_weight,
                                    blocks.labels.to(self.dev, non_blocking=True),
                                    loss_fn=self.loss_fn, weighting=a.loss_weighting, streak_alpha=a.streak_alpha,
                                    decay_gamma=a.decay_gamma, use_soft_labels=a.use_soft_labels,
                                    kl_temperature=a.kl_temperature, kl_weight=a.kl_weight, ce_target=a.ce_target,
                                    top_k=self.drafter.candidates_k,
                                    host_stats=False)
            sel = None
            if self.drafter.selector is not None:  # DFlash 2: + alpha x the selector's K-way CE (dflash2.py)
                sel_loss, sel = selector_loss(self.drafter.selector, student[:, 1:], self.lm_head_weight, st["labels"],
                                              blocks.predecessors[:, 1:].to(self.dev, non_blocking=True),
                                              st["weights"][:, 1:], candidates=st["top_ids"])
                loss = loss + a.selector_loss_alpha * sel_loss
        (loss / a.grad_accum).backward()
        # No host sync here: the statistics stay on the device until train_step reads them, once.
        out.update(loss=loss.detach().double(), ce=st["ce"], kl=st["kl"], correct=st["correct"], count=st["count"],
                   rows=blocks.input_ids.numel(), span=span.stop())
        if sel is not None:
            out["selector"] = torch.stack([sel[k] for k in self.SELECTOR_SUMS])
        return out

    def next_micro_batch(self):
        """The next item of the global sequence (the looked-ahead ones first)."""
        return self.ahead.popleft() if self.ahead else next(self.upcoming)

    def prepare_next(self, g):
        """Prepare this rank's first micro-batch after global position g (while the device is busy):
        its host work and, on CUDA, its attention queued behind what the device runs now. The items
        looked at stay in `ahead`, so the sequence train_step consumes is unchanged."""
        k = 0
        while (g + 1 + k) % self.r.world != self.r.rank:
            k += 1
        while len(self.ahead) <= k:
            self.ahead.append(next(self.upcoming))
        self.prepared = self.prepare(*self.ahead[k])
        if self.dev.startswith("cuda"):
            self.prepared.to_device(self.dev)

    def all_reduce_grads(self):
        """Average gradients over drafter ranks. A plain all-reduce per parameter, not a DDP wrapper:
        a rank whose micro-batches had no anchors skipped backward, which DDP's hooks cannot express."""
        grads = []
        for q in self.drafter.parameters():
            if q.grad is None:
                q.grad = torch.zeros_like(q)
            grads.append(q.grad)
        for w in [dist.all_reduce(g, async_op=True) for g in grads]:
            w.wait()
        for g in grads:
            g.div_(self.r.world)

    # Statistics of a step: host-side sums (what the host knows anyway) and device-side sums (what the
    # loss computed), put in one vector that is all-reduced once per step (statistics for rank 0 and
    # the stop flag) and read back once, after the optimizer step.
    STEP_SUMS = ("n_loss", "n_kl", "rows", "tokens", "target_s", "worker_s", "drafter_s", "wait_s", "serve_s",
                 "occupancy", "n_occupancy", "stop")
    SELECTOR_SUMS = ("loss", "correct", "found", "rows")  # DFlash 2's, after the loss's (dflash2.selector_loss)

    def train_step(self) -> dict:
        """One optimizer step, queued and then read: its record (metrics.jsonl's line)."""
        return self.read_step(self.launch_step())

    def launch_step(self) -> "Launched":
        """Queue one optimizer step (its micro-batches, the gradient all-reduce, clipping and AdamW)
        without waiting for the device; read_step reads its statistics."""
        a = self.args
        noise = noise_at(self.step, self.total_steps, a.noise_start, a.noise_end)
        b1 = a.block_size - 1
        acc = dict.fromkeys(self.STEP_SUMS, 0.0)
        # float64 [loss, ce, kl, correct x b1, count x b1] (+ SELECTOR_SUMS for DFlash 2)
        dev_sums, spans = None, []
        t_step = time.perf_counter()
        first = self.step * self.per_step
        for j in range(self.per_step):
            epoch, index, idx = self.next_micro_batch()
            self.epoch, self.batch_index = epoch, index + 1
            if (first + j) % self.r.world != self.r.rank:
                continue
            m = self.micro_batch(epoch, index, idx, noise)
            if self.PREPARE_AHEAD:  # backward is queued: the host prepares the next micro-batch meanwhile
                self.prepare_next(first + j)
            for k in ("tokens", "target_s", "worker_s", "wait_s", "serve_s"):
                acc[k] += m[k]
            if m["occupancy"] is not None:
                acc["occupancy"] += m["occupancy"]
                acc["n_occupancy"] += 1
            if "loss" in m:
                acc["n_loss"] += 1
                acc["rows"] += m["rows"]
                spans.append(m["span"])
                kl = m["kl"]
                if kl is not None:
                    acc["n_kl"] += 1
                else:
                    kl = torch.zeros_like(m["ce"])
                v = torch.cat([torch.stack([m["loss"], m["ce"], kl]), m["correct"].double(), m["count"].double(),
                               *([m["selector"]] if "selector" in m else [])])
                dev_sums = v if dev_sums is None else dev_sums + v
        if dev_sums is None:
            n_sel = len(self.SELECTOR_SUMS) if self.drafter.selector is not None else 0
            dev_sums = torch.zeros(3 + 2 * b1 + n_sel, dtype=torch.float64, device=self.dev)
        cuda = self.dev.startswith("cuda")
        reduce_span = None
        if self.r.world > 1:
            reduce_span = DeviceSpan(self.dev)
            self.all_reduce_grads()
            # This rank's busy time joins the reduced vector: wait for the end of its backward only,
            # while the gradient all-reduce queued behind it keeps the device busy.
            acc["drafter_s"] = sum(sp.seconds() for sp in spans)
            # Stopping is decided together: one rank leaving the loop alone would hang the others
            # in their next all-reduce, so a local SIGTERM only counts once it has been reduced.
            acc["stop"] = float(self._local_stop())
            host = torch.tensor([acc[k] for k in self.STEP_SUMS], dtype=torch.float64)
            host = host.pin_memory().to(self.dev, non_blocking=True) if cuda else host
            vec = torch.cat([host, dev_sums])
            dist.all_reduce(vec)
            reduce_span.stop()
        else:
            vec = dev_sums
        lr = self.sched.get_last_lr()[0]
        gnorm = clipped_step(self.opt, a.grad_clip if a.grad_clip > 0 else float("inf"))
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return Launched(self.step, t_step, lr, noise, self.epoch_float(), acc, spans, reduce_span,
                        torch.cat([vec, gnorm.detach().reshape(1).to(vec)]))

    def read_step(self, s: "Launched") -> dict:
        """Wait for a launched step and return its record: the step's one read of the device."""
        a = self.args
        b1 = a.block_size - 1
        acc = s.acc
        vals = s.sums.tolist()
        grad_norm = vals.pop()
        if self.r.world > 1:
            acc = dict(zip(self.STEP_SUMS, vals[:len(self.STEP_SUMS)], strict=True))
            vals = vals[len(self.STEP_SUMS):]
            self.stop_requested = acc["stop"] > 0
        acc["loss"], acc["ce"], acc["kl"] = vals[:3]
        correct, count, sel = vals[3:3 + b1], vals[3 + b1:3 + 2 * b1], vals[3 + 2 * b1:]
        if self.r.world > 1:
            acc["drafter_s"] += s.reduce_span.seconds() * self.r.world  # the all-reduces, as every rank spent them
        else:
            acc["drafter_s"] = sum(sp.seconds() for sp in s.spans)
        # From its launch, or from the previous step's read if that came later (a step launched
        # ahead): consecutive steps' times add up to the wall time, never twice over.
        now = time.perf_counter()
        step_s = now - max(s.t_launch, self._last_read)
        self._last_read = now
        accs = [c / n if n > 0 else float("nan") for c, n in zip(correct, count, strict=True)]
        mean = lambda x, n: x / n if n else float("nan")  # noqa: E731
        n_t, n_d = self.r.n_targets, self.r.world
        return {
            "step": s.step, "epoch": round(s.epoch, 4), "loss": mean(acc["loss"], acc["n_loss"]),
            "ce": mean(acc["ce"], acc["n_loss"]), "kl": mean(acc["kl"], acc["n_kl"]) if acc["n_kl"] else None,
            "lr": s.lr, "noise": s.noise, "grad_norm": grad_norm, "acc": accs, "accept_proxy": acceptance_proxy(accs),
            "rows": int(acc["rows"]), "target_tokens": int(acc["tokens"]),
            # rates while busy, summed over workers: what each side can deliver (capacity)
            "target_tokens_per_s": acc["tokens"] * n_t / max(acc["target_s"], 1e-9),
            "drafter_rows_per_s": acc["rows"] * n_d / max(acc["drafter_s"], 1e-9),
            # what the run actually got this step
            "step_tokens_per_s": acc["tokens"] / step_s, "step_rows_per_s": acc["rows"] / step_s,
            "target_s": acc["target_s"] / n_t, "drafter_s": acc["drafter_s"] / n_d, "step_s": step_s,
            "queue_occupancy": mean(acc["occupancy"], acc["n_occupancy"]) if acc["n_occupancy"] else None,
            # the workers' idle: what the drafters served themselves was not their time
            "target_idle_frac": min(1.0, max(0.0, 1 - acc["worker_s"] / (n_t * step_s))),
            "drafter_idle_frac": min(1.0, max(0.0, acc["wait_s"] / (n_d * step_s))),
            "drafter_serve_frac": min(1.0, max(0.0, acc["serve_s"] / (n_d * step_s))),
            "peak_mem_bytes": _peak_mem(self.dev),
            **(self.selector_record(dict(zip(self.SELECTOR_SUMS, sel, strict=True)), acc["n_loss"]) if sel else {}),
        }

    @staticmethod
    def selector_record(sel: dict, n_loss) -> dict:
        """DFlash 2's step keys (contract.metrics.SELECTOR_KEYS) from the summed SELECTOR_SUMS."""
        mean = lambda x, n: x / n if n else float("nan")  # noqa: E731
        return dict(zip(contract.SELECTOR_KEYS, (mean(sel["loss"], n_loss), mean(sel["correct"], sel["found"]),
                                                 mean(sel["found"], sel["rows"])), strict=True))

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self) -> Path:
        self.status.update(phase="saving", step=self.step)
        state = {
            "step": self.step, "epoch": self.epoch, "batch_index": self.batch_index,
            "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "args": self.args.to_flat(), "total_steps": self.total_steps, "world": self.r.world,
        }
        path = ckpt.save_checkpoint(self.ckpt_root, self.step, self.drafter.state_dict(), self.dcfg.to_dict(), state,
                                    keep=self.args.keep_checkpoints)
        self.status.update(newest_checkpoint=str(path))
        self.log(f"saved {path}")
        return path

    def evaluate(self, num_prompts=None, kind="final"):
        """tau on the held-out prompts (the first num_prompts of each set, default --eval-num-prompts):
        evaluate.speculative_tau's figures plus `eval` (final | interval) and `eval_s`, or None."""
        a = self.args
        n = a.eval_num_prompts if num_prompts is None else num_prompts
        if not eval_wanted(a, n):
            return None
        if self.producer is None:  # a drafter rank without a target of its own borrows one for evaluation
            self.producer = HiddenStateProducer(a.target_model, [self.dev], self.facts.layer_ids, self.dev)
        return evaluate_drafter(a, self.producer, self.drafter, n, kind)

    EVAL_BUDGET = 0.05  # interval evaluations may use at most this share of the training's wall time
    # Where target workers feed this rank (feed.QueueFeed without a replica of its own), an interval
    # evaluation runs in a worker, on that worker's replica, with the weights of its step
    # (feed.EvalRequest). False: the drafter ranks keep training meanwhile and the record comes
    # when the worker is done; True: rank 0 waits for it (the other ranks in the next all-reduce).
    # docs/trainer.md gives the measurement that chose False.
    EVAL_WAITS = False

    def interval_eval(self, metrics, wandb_run, elapsed_s):
        """An --eval-interval evaluation, unless evaluations so far have used EVAL_BUDGET of the wall
        time (then it waits for a later interval: an untrained drafter's evaluation is the slowest,
        tau ~1 means one cycle per token). Which replica: the one in this process (in-process
        target, --drafter-serves-target); else a target worker's (`feed.submit_eval`: the worker
        evaluates a copy of this step's weights); else (vLLM servers) one borrowed onto this rank's
        device for the evaluation and released after it, as the final evaluation borrows one."""
        if self.eval_spent_s > self.EVAL_BUDGET * elapsed_s:
            self.log(f"interval evaluation at step {self.step} deferred: evaluations used "
                     f"{self.eval_spent_s:.0f} s of {elapsed_s:.0f} s (budget {self.EVAL_BUDGET:.0%})")
            return
        a = self.args
        if not eval_wanted(a, a.eval_interval_prompts):
            return
        if self.producer is None and hasattr(self.feed, "submit_eval"):
            if self.eval_pending is not None:
                self.log(f"interval evaluation at step {self.step} skipped: the one of step "
                         f"{self.eval_pending[0]} is still running")
                return
            weights = {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}
            self.eval_pending = (self.step, weights, list(self.recent))  # kept alive until its answer
            self.feed.submit_eval(self.step, weights, self.dcfg.to_dict())
            if self.EVAL_WAITS:
                self.collect_evals(metrics, wandb_run, wait=True)
            return
        borrowed = self.producer is None
        res = self.evaluate(a.eval_interval_prompts, "interval")
        if borrowed:  # released: mid-run, the drafter's device holds only what --check counted
            self.producer = None
            if self.dev.startswith("cuda"):
                torch.cuda.empty_cache()
        if res is not None:
            self.eval_spent_s += res["eval_s"]
            self.log_eval(res, metrics, wandb_run)

    def collect_evals(self, metrics, wandb_run, wait=False):
        """Log the interval evaluation a target worker has finished (wait: until it has). Its record
        carries the step it evaluated; W&B gets it at this step (W&B steps only increase). What it
        counts against the budget: its seconds over the run's target replicas, the share of the
        targets' time it took from training (the drafters kept training meanwhile)."""
        if self.eval_pending is None:
            return
        got = self.feed.eval_results(wait)
        if not got:
            return
        step, res = got[-1]
        pending_step, _weights, recent = self.eval_pending
        self.eval_pending = None
        if step != pending_step:
            raise RuntimeError(f"interval evaluation of step {step} came back, step {pending_step} was asked for")
        self.eval_spent_s += res["eval_s"] / (1 if self.EVAL_WAITS else max(1, self.r.n_targets))
        self.log_eval(res, metrics, wandb_run, step=step, recent=recent)

    # The guard against "training accuracy high, tau about 1" (SpecForge #455). Over the newest
    # TAU_GAP_WINDOW training steps the first draft position was right acc1 of the time; served, it
    # is accepted accept_rate[0]. A healthy drafter is accepted about as often as it was right in
    # training (its data are the target's own samples); one trained on shifted labels is right in
    # training (position 1 copying the anchor, say) and rarely accepted. Warn when acc1 is at least
    # TAU_GAP_MIN_ACC and the acceptance less than TAU_GAP_RATIO of it.
    TAU_GAP_MIN_ACC, TAU_GAP_RATIO, TAU_GAP_WINDOW = 0.5, 0.5, 10
    # DIAGNOSTIC, for tests only (no flag sets it): 1 trains every block position on the token one
    # position early (shift_labels_late), the misalignment the guard above exists to catch.
    LABEL_SHIFT = 0

    def tau_gap(self, res, step=None, recent=None) -> dict:
        """The guard's figures for an evaluation record (contract.TRAIN_TAU, TRAIN_ACC1, TAU_GAP_WARNING)
        of the weights after `step` (default: now), against the training steps before it (`recent`)."""
        step = self.step if step is None else step
        recent = self.recent if recent is None else recent
        if not recent:
            return {contract.TRAIN_TAU: None, contract.TRAIN_ACC1: None, contract.TAU_GAP_WARNING: None}
        train_tau = 1 + sum(p for p, _ in recent) / len(recent)
        acc1 = sum(a for _, a in recent) / len(recent)
        served = res["accept_rate"][0] if res["accept_rate"] else None
        warn = (served is not None and acc1 >= self.TAU_GAP_MIN_ACC and served < self.TAU_GAP_RATIO * acc1)
        return {contract.TRAIN_TAU: train_tau, contract.TRAIN_ACC1: acc1, contract.TAU_GAP_WARNING:
                messages.tau_gap(step, res["tau_pooled"], train_tau, acc1, served) if warn else None}

    def log_eval(self, res, metrics, wandb_run, step=None, recent=None):
        """An evaluation of the weights after `step` (default: now): metrics.jsonl, W&B (at this step), the log."""
        step = self.step if step is None else step
        res = {**res, **self.tau_gap(res, step, recent)}
        warning = res[contract.TAU_GAP_WARNING]
        metrics.write({"step": step, **res})
        # W&B keeps numbers: each tau beside what it was measured with (thinking as on = 1, off = 0,
        # greedy drafts while sampling as 1)
        thinking = {"on": 1, "off": 0}.get(res["thinking"])
        words = ("thinking", "draft_sample_method")
        wandb_run.log({"tau_pooled": res["tau_pooled"], "tau_prompt_mean": res["tau_prompt_mean"], "eval_step": step,
                       **{f"eval_{k}": res[k] for k in contract.EVAL_SETTINGS if k not in words},
                       "eval_greedy_drafts": int(res["draft_sample_method"] == "greedy"),
                       **({} if thinking is None else {"eval_thinking": thinking}),
                       **{f"accept_rate/pos{k + 1}": r for k, r in enumerate(res["accept_rate"]) if r is not None}},
                      self.step)
        self.log(f"{res['eval']} evaluation at step {step}: tau_pooled {res['tau_pooled']:.3f}, "
                 f"tau_prompt_mean {res['tau_prompt_mean']:.3f} over {res['prompts']} prompts "
                 f"(block {self.args.block_size}, {contract.settings_label(res)}, {res['cycles']} cycles, "
                 f"{res['eval_s']:.1f} s)")
        if warning:
            self.log(warning)

    # ---- the loop ----------------------------------------------------------------------------
    # Queue step n+1 before reading step n, so the device goes from one step to the next without
    # idling while the host launches (the read is the step's only wait; without this the device
    # idles from the end of each step's optimizer until the next forward's first kernels come).
    # None: on CUDA with one drafter rank (several ranks already wait for each other's backward in
    # the gradient all-reduce; on the CPU the host is the device).
    LAUNCH_AHEAD = None

    def launch_ahead(self) -> bool:
        on = self.dev.startswith("cuda") if self.LAUNCH_AHEAD is None else self.LAUNCH_AHEAD
        return bool(on) and self.r.world == 1

    def may_follow(self, n: int) -> bool:
        """Whether step n+1 may be queued before step n is read: not after the last step, not when
        step n is saved or evaluated (they need the weights after n, not after n+1), not once a
        stop was asked for (the run stops after the steps already queued)."""
        a = self.args
        return (n < self.total_steps and not self.stop_requested and not self._local_stop()
                and n % a.save_interval != 0 and not (a.eval_interval and n % a.eval_interval == 0))

    def train(self, metrics, wandb_run, on_step=None) -> str:
        """Steps until done or stopped. Every rank runs this; only rank 0 saves, logs and notifies."""
        a, main = self.args, self.r.is_main
        self.status.update(phase="training", step=self.step, epoch=self.epoch)
        last_saved = self.step
        if self.step >= self.total_steps and not self.status.state["ready"]:
            # Resumed at the end, nothing left to train: still tell systemd the start succeeded, or a
            # Type=notify unit counts the clean exit as a failed start (Result=protocol) and restarts.
            self.r.notifier.ready(f"nothing left to train at step {self.step}")
            self.status.update(ready=True)
        t_train = time.perf_counter()
        ahead = self.launch_ahead()
        queued = None  # a step launched before the previous one was read
        while queued is not None or (self.step < self.total_steps and not self.stop_requested):
            launched = queued or self.launch_step()
            queued = self.launch_step() if ahead and self.may_follow(launched.step) else None
            rec = self.read_step(launched)
            n = rec["step"]
            # The step's one host read brought the loss and grad norm (all-reduced: every rank sees
            # the same numbers and stops together). A non-finite one stops the run before anything
            # saves: the fused AdamW skipped that update (optim.clipped_step), the CPU's went into the
            # weights; either way the newest checkpoint stays the last good one.
            for what, v in (("loss", rec["loss"]), ("grad norm", rec["grad_norm"])):
                if rec["rows"] and not math.isfinite(v):
                    raise NonFiniteLoss(n, v, what)
            if main:
                metrics.write(rec)
                wandb_run.log(rec, n)
                if rec["acc"] and math.isfinite(rec["acc"][0]):
                    self.recent = [*self.recent, (rec["accept_proxy"], rec["acc"][0])][-self.TAU_GAP_WINDOW:]
            if not self.status.state["ready"]:
                self.r.notifier.ready(f"training, step {n}")
                self.status.update(ready=True)
            self.r.notifier.watchdog()
            if main and (n % a.log_interval == 0 or n == self.total_steps):
                self.log(f"step {n}/{self.total_steps} ep {rec['epoch']:.3f} loss {rec['loss']:.4f} "
                         f"ce {rec['ce']:.4f} acc1 {rec['acc'][0]:.3f} proxy {rec['accept_proxy']:.2f} "
                         f"lr {rec['lr']:.2e} target {rec['target_tokens_per_s']:.0f} tok/s "
                         f"drafter {rec['drafter_rows_per_s']:.0f} rows/s idle t/d "
                         f"{rec['target_idle_frac']:.2f}/{rec['drafter_idle_frac']:.2f}"
                         + (f" selector loss {rec['selector_loss']:.4f} acc {rec['selector_acc']:.3f} recall "
                            f"{rec['candidate_recall']:.3f}" if "selector_loss" in rec else ""))
            # (may_follow kept the next step from being queued here: these see the weights after n)
            if main:  # a target worker's interval evaluation, if it is done
                self.collect_evals(metrics, wandb_run)
            if main and a.eval_interval and n % a.eval_interval == 0 and n < self.total_steps:
                self.interval_eval(metrics, wandb_run, time.perf_counter() - t_train)
            if on_step is not None:
                on_step(self)
            if self.r.world == 1:
                self.stop_requested = self._local_stop()
            if n % a.save_interval == 0 and not self.stop_requested:
                if main:
                    self.save()
                last_saved = n
            self.status.update(phase="training", step=n, epoch=self.epoch)
        if main and (self.step > last_saved or (self.step > 0 and ckpt.newest_complete(self.ckpt_root) is None)):
            self.save()
        if main and self.eval_pending is not None:
            # Its record before the final one's; and on a stop too: the request on the node's queue
            # refers to this process's copy of the weights, which must outlive the worker's read.
            self.log(f"waiting for the interval evaluation of step {self.eval_pending[0]}")
            self.collect_evals(metrics, wandb_run, wait=True)
        self.feed.close()  # (a queue feed takes the answers still outstanding: feed.QueueFeed.close)
        if self.r.world > 1:  # and no rank leaves before all have: an answer may live in another rank's memory
            dist.barrier()
        if self.stop_requested:
            return "stopped"
        res = self.evaluate() if main else None
        if res is not None:
            self.log_eval(res, metrics, wandb_run)
        return "completed"


def run_rank(args, facts: StartFacts, log=print, on_step=None, rank: Rank | None = None, feed: Feed | None = None) -> str:
    """Set up and train one drafter rank; rank 0 owns status.json, metrics.jsonl, wandb and checkpoints.

    Returns the final phase. Errors are recorded in status.json (rank 0) and re-raised.
    """
    r = rank or Rank(n_targets=max(1, len(facts.servers)))  # in-process: one target, or the vLLM servers
    out = Path(args.output_dir)
    if r.is_main:
        # pid: the process systemd watches; a main process of its own owns status.json's `workers`
        status = Status(out, pid=r.main_pid, adopt=("workers",) if r.main_pid != os.getpid() else ())
        status.update(phase="loading")
    else:
        status = Status.null()
    trainer = Trainer(args, facts, status, log, r, feed)
    previous = signal.signal(signal.SIGTERM, trainer.request_stop)
    metrics = wandb_run = None
    try:
        # This start's number and the run's W&B id, kept in the run directory across restarts.
        start = begin_run(out, args.wandb_run_name or out.resolve().name) if r.is_main else None
        trainer.setup()
        if r.is_main:
            (out / layout.RUN_CONFIG).write_text(json.dumps(args.to_flat(), indent=1, default=str) + "\n")
            metrics = MetricsLog(out, start.invocation)  # its first step supersedes (contract.metrics)
            wandb_run = wandb_compat.WandbRun(args.wandb_project, args.wandb_run_name, facts.wandb_settings,
                                              args.to_flat(), out, run_id=start.wandb_id)
            log(f"start {start.invocation} of this run at step {trainer.step} (W&B id {start.wandb_id})")
        else:
            metrics, wandb_run = MetricsLog.null(), None
        phase = trainer.train(metrics, wandb_run, on_step)
        status.update(phase=phase, step=trainer.step, epoch=trainer.epoch)
        if wandb_run is not None:
            wandb_run.finish()
        if r.is_main:
            log(f"{phase} at step {trainer.step}")
        return phase
    except BaseException as e:
        if trainer.feed is not None:
            trainer.feed.close(wait=False)  # nothing more is asked of the targets
        why = e.line() if isinstance(e, NonFiniteLoss) else f"{type(e).__name__}: {e}".splitlines()[0]
        status.update(phase="failed", step=trainer.step, last_error=why)
        if wandb_run is not None:
            wandb_run.finish(exit_code=1)
        raise
    finally:
        if metrics is not None:
            metrics.close()
        signal.signal(signal.SIGTERM, previous)
