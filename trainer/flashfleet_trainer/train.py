"""The training loop: preflight, load, train, checkpoint, evaluate, with systemd and SIGTERM in mind.

`preflight(args)` is everything `--check` validates; a real start runs exactly the same code
first, so a deterministic start-up error is the same one-line ConfigError (exit 78) whether it
is found by `--check` on the controller or by the unit on the host.
"""

import json
import math
import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint as ckpt
from . import notify, wandb_compat
from .config import ConfigError, parse_devices
from .data import build_blocks, check_schema, load_data, pack_epoch, sample_anchors
from .evaluate import load_prompts, speculative_tau
from .loss import acceptance_proxy, drafter_loss, get_loss_fn
from .metrics import MetricsLog, Status
from .model import (
    DFlashDrafter,
    DrafterConfig,
    HiddenStateProducer,
    default_mask_token_id,
    default_target_layers,
    drafter_hidden,
)


@dataclass
class Plan:
    """What preflight found: the facts the trainer starts from."""

    target_config: object
    layer_ids: list
    mask_token_id: int
    target_devices: list
    drafter_device: str
    data_files: list
    data_rows: int
    wandb_settings: dict
    summary: list


def _mem_available_bytes() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _model_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) or \
        sum(f.stat().st_size for f in model_dir.glob("*.bin"))


def preflight(args) -> Plan:
    """Validate paths, model config, data schema, devices, memory and wandb. Raises ConfigError."""
    from transformers import AutoConfig

    summary = []
    model_dir = Path(args.target_model)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"--target-model {model_dir}: no config.json there (not a local model directory)",
                          "stage the model first and point --target-model at its directory")
    try:
        tcfg = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:
        raise ConfigError(f"--target-model {model_dir}: config.json not loadable ({str(e).splitlines()[0]})",
                          "use a transformers model directory of a supported architecture") from e
    if not _model_bytes(model_dir):
        raise ConfigError(f"--target-model {model_dir}: no *.safetensors or *.bin weights", "stage the weights too")
    for attr in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
        if not hasattr(tcfg, attr):
            raise ConfigError(f"target model type {tcfg.model_type!r} has no {attr}", "use a decoder-only LM (Qwen3 first)")
    n_layers = tcfg.num_hidden_layers
    if args.target_layers:
        try:
            layer_ids = [int(x) for x in str(args.target_layers).split(",") if x.strip()]
        except ValueError as e:
            raise ConfigError(f"--target-layers {args.target_layers!r} is not a list of integers", "e.g. 1,9,17,25,33") from e
    else:
        layer_ids = default_target_layers(n_layers, args.num_draft_layers)
    if not layer_ids or min(layer_ids) < 0 or max(layer_ids) >= n_layers:
        raise ConfigError(f"--target-layers {layer_ids} outside the target's decoder layers 0..{n_layers - 1}",
                          "use 0-based decoder-layer indices")
    mask_id = default_mask_token_id(tcfg.vocab_size) if args.mask_token_id is None else args.mask_token_id
    if not 0 <= mask_id < tcfg.vocab_size:
        raise ConfigError(f"--mask-token-id {mask_id} is not a row of the target's {tcfg.vocab_size}-row embedding",
                          "pick a spare row of the target vocabulary")
    summary.append(f"target {model_dir} ({tcfg.model_type}, {n_layers} layers, hidden {tcfg.hidden_size}, "
                   f"vocab {tcfg.vocab_size}); features from decoder layers {layer_ids}; mask id {mask_id}")

    files, rows = check_schema(args.data_dir)
    summary.append(f"data {args.data_dir}: {len(files)} Parquet file(s), {rows} rows, schema ok")

    target_devices = parse_devices(args.target_gpus, "--target-gpus")
    drafter_devices = parse_devices(args.drafter_gpus, "--drafter-gpus")
    if len(drafter_devices) != 1:
        raise ConfigError(f"--drafter-gpus {args.drafter_gpus}: one drafter device is supported today",
                          "pass a single GPU index (or cpu) to --drafter-gpus")
    cuda = [d for d in target_devices + drafter_devices if d != "cpu"]
    if cuda:
        have = torch.cuda.device_count()
        top = max(int(d.split(":")[1]) for d in cuda)
        if top >= have:
            raise ConfigError(f"GPU {top} requested (--target-gpus {args.target_gpus} --drafter-gpus "
                              f"{args.drafter_gpus}) but {have} CUDA device(s) are visible",
                              "request only visible GPUs, or `cpu` for both")
    summary.append(f"topology: {len(target_devices)} target replica(s) on {','.join(target_devices)}; "
                   f"drafter on {drafter_devices[0]}")

    # Memory: target replicas in their compute dtype, drafter params + grads + AdamW state in fp32.
    stored = _model_bytes(model_dir)
    stored_per_param = 2 if "16" in str(getattr(tcfg, "dtype", None) or getattr(tcfg, "torch_dtype", "")) else 4
    params = stored / stored_per_param
    h, i_sz = tcfg.hidden_size, tcfg.intermediate_size
    drafter_params = args.num_draft_layers * (4 * h * h + 3 * h * i_sz) + len(layer_ids) * h * h
    need = {}
    for d in target_devices:
        need[d] = need.get(d, 0) + params * (4 if d == "cpu" else 2) * 1.1
    need[drafter_devices[0]] = need.get(drafter_devices[0], 0) + drafter_params * 16
    for d, b in need.items():
        free = _mem_available_bytes() if d == "cpu" else torch.cuda.mem_get_info(int(d.split(":")[1]))[0]
        if b > free:
            raise ConfigError(f"{d} needs about {b / 2**30:.1f} GiB for weights and optimizer state but "
                              f"{free / 2**30:.1f} GiB is free", "use more/larger GPUs or fewer draft layers")
    summary.append(f"memory estimate: target {params / 1e6:.1f}M params, drafter ~{drafter_params / 1e6:.1f}M "
                   "trainable; fits free memory (activations not counted)")

    settings = wandb_compat.parse_settings(args.wandb_settings)
    summary.append(wandb_compat.check(args.wandb_project, args.wandb_run_name, settings))
    try:
        get_loss_fn(args.loss_impl)
    except ImportError as e:
        raise ConfigError(f"--loss-impl triton but flashfleet_kernels is not importable ({e})",
                          "install the kernels package or use --loss-impl auto") from e

    out = Path(args.output_dir)
    probe = out  # the nearest existing ancestor decides whether the run can create its directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise ConfigError(f"--output-dir {out} is not writable", "create it or fix its ownership")
    return Plan(tcfg, layer_ids, mask_id, target_devices, drafter_devices[0], files, rows, settings, summary)


def lr_lambda(total_steps: int, warmup_ratio: float):
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


def _peak_mem(device) -> int:
    if str(device).startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sync(devices):
    for d in set(devices):
        if str(d).startswith("cuda"):
            torch.cuda.synchronize(d)


class Trainer:
    def __init__(self, args, plan: Plan, status: Status, log=print):
        self.args, self.plan, self.status, self.log = args, plan, status, log
        self.out = Path(args.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.stop_requested = False
        self.step = 0
        self.epoch, self.batch_index = 0, 0
        self._epoch_cache = (None, None)

    def request_stop(self, *_):
        """SIGTERM: finish the current step, save, exit 0."""
        if not self.stop_requested:
            self.stop_requested = True
            notify.stopping()
            self.log("stop requested: finishing the current step, then saving")

    # ---- setup -------------------------------------------------------------------------------
    def setup(self):
        a, p = self.args, self.plan
        torch.manual_seed(a.seed)
        self.dev = p.drafter_device
        notify.status("loading target")
        self.producer = HiddenStateProducer(a.target_model, p.target_devices, p.layer_ids, self.dev,
                                            on_status=lambda s: (notify.status(s), self.log(s)))
        notify.status("loading data")
        self.data = load_data(a.data_dir, a.max_seq_len, p.target_config.vocab_size)
        self.batches_per_epoch = len(pack_epoch(self.data.lengths, a.seed, 0, a.token_budget, a.max_batch_size))
        by_epochs = max(1, int(a.epochs * self.batches_per_epoch) // a.grad_accum)
        self.total_steps = a.max_steps if a.max_steps else by_epochs
        self.dcfg = DrafterConfig.from_target(p.target_config, num_draft_layers=a.num_draft_layers,
                                              target_layer_ids=p.layer_ids, block_size=a.block_size,
                                              mask_token_id=p.mask_token_id, target_model=a.target_model)
        self.drafter = DFlashDrafter(self.dcfg).to(self.dev)  # fp32 master weights
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=a.lr, weight_decay=a.weight_decay,
                                     betas=(0.9, 0.95), eps=1e-8)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(self.total_steps, a.warmup_ratio))
        self.gen = torch.Generator().manual_seed(a.seed + 1)  # anchors and noise
        self.loss_fn, self.loss_impl = get_loss_fn(a.loss_impl)
        self.resume()
        n_params = sum(q.numel() for q in self.drafter.parameters())
        self.log(f"drafter: {n_params / 1e6:.2f}M trainable params, {self.dcfg.num_hidden_layers} layers, block "
                 f"{a.block_size}; {len(self.data)} sequences, {self.batches_per_epoch} micro-batches/epoch, "
                 f"{self.total_steps} steps; loss impl {self.loss_impl}; starting at step {self.step}")

    def resume(self):
        a = self.args
        if a.resume == "never":
            return
        if a.resume == "auto":
            path = ckpt.newest_complete(self.ckpt_root)
            if path is None:
                return
        else:
            path = Path(a.resume)
            if not ckpt.is_complete(path):
                raise ConfigError(f"--resume {path} is not a complete checkpoint (manifest missing or mismatched)",
                                  "pass --resume auto or a complete checkpoints/step-XXXXXXXX")
        weights, cfg, state = ckpt.load_checkpoint(path, map_location="cpu")
        mine = self.dcfg.to_dict()
        diff = [k for k in ("hidden_size", "num_hidden_layers", "target_layer_ids", "block_size", "vocab_size")
                if cfg.get(k) != mine.get(k)]
        if diff:
            raise ConfigError(f"checkpoint {path} has a different drafter ({', '.join(diff)} differ)",
                              "use a new --output-dir or --resume never")
        self.drafter.load_state_dict(weights)
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.gen.set_state(state["rng"]["generator"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"].get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], state["batch_index"]
        self.status.update(newest_checkpoint=str(path))
        self.log(f"resumed from {path} (step {self.step}, epoch {self.epoch}, micro-batch {self.batch_index})")

    # ---- data --------------------------------------------------------------------------------
    def next_micro_batch(self) -> list[int]:
        a = self.args
        if self._epoch_cache[0] != self.epoch:
            self._epoch_cache = (self.epoch, pack_epoch(self.data.lengths, a.seed, self.epoch, a.token_budget,
                                                        a.max_batch_size))
        batches = self._epoch_cache[1]
        if self.batch_index >= len(batches):
            self.epoch, self.batch_index = self.epoch + 1, 0
            return self.next_micro_batch()
        idx = batches[self.batch_index]
        self.batch_index += 1
        return idx

    def epoch_float(self) -> float:
        return self.epoch + self.batch_index / max(1, self.batches_per_epoch)

    # ---- one optimizer step ------------------------------------------------------------------
    def train_step(self) -> dict:
        a = self.args
        noise = noise_at(self.step, self.total_steps, a.noise_start, a.noise_end)
        t_target = t_drafter = 0.0
        tokens = rows = 0
        losses, ce, kl = [], [], []
        correct = torch.zeros(a.block_size - 1)
        count = torch.zeros(a.block_size - 1)
        t_step = time.perf_counter()
        for _ in range(a.grad_accum):
            idx = self.next_micro_batch()
            seqs, masks = zip(*(self.data.seq(i) for i in idx), strict=True)
            t0 = time.perf_counter()
            feats, last, lengths = self.producer.produce(seqs)
            _sync(self.plan.target_devices + [self.dev])
            t_target += time.perf_counter() - t0
            tokens += int(lengths.sum())
            t0 = time.perf_counter()
            anchors = sample_anchors(list(masks), a.max_anchors, self.gen)
            if sum(len(x) for x in anchors) == 0:
                continue  # nothing supervised in this micro-batch
            blocks = build_blocks(list(seqs), list(masks), anchors, a.block_size, self.dcfg.mask_token_id)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.dev.startswith("cuda")):
                student = drafter_hidden(self.drafter, self.producer.embed_weight, feats, blocks, noise, self.gen)
                teacher = None
                if a.use_soft_labels:
                    tpos = torch.minimum(blocks.teacher_pos, (lengths[blocks.seq] - 1)[:, None])
                    teacher = last[blocks.seq.to(self.dev)[:, None], tpos.to(self.dev)]
                loss, st = drafter_loss(student, teacher, self.producer.lm_head_weight, blocks.labels.to(self.dev),
                                        loss_fn=self.loss_fn, weighting=a.loss_weighting, streak_alpha=a.streak_alpha,
                                        decay_gamma=a.decay_gamma, use_soft_labels=a.use_soft_labels,
                                        kl_temperature=a.kl_temperature, kl_weight=a.kl_weight)
            (loss / a.grad_accum).backward()
            _sync([self.dev])
            t_drafter += time.perf_counter() - t0
            rows += blocks.input_ids.numel()
            losses.append(float(loss.detach()))
            ce.append(st["ce"])
            if st["kl"] is not None:
                kl.append(st["kl"])
            correct += torch.tensor(st["correct"], dtype=torch.float32)
            count += torch.tensor(st["count"], dtype=torch.float32)
        gnorm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(),
                                               a.grad_clip if a.grad_clip > 0 else float("inf"))
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        step_s = time.perf_counter() - t_step
        acc = [(c / n).item() if n > 0 else float("nan") for c, n in zip(correct, count, strict=True)]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        return {
            "step": self.step, "epoch": round(self.epoch_float(), 4), "loss": mean(losses), "ce": mean(ce),
            "kl": mean(kl) if kl else None, "lr": lr, "noise": noise, "grad_norm": float(gnorm), "acc": acc,
            "accept_proxy": acceptance_proxy(acc), "rows": rows, "target_tokens": tokens,
            "target_tokens_per_s": tokens / max(t_target, 1e-9), "drafter_rows_per_s": rows / max(t_drafter, 1e-9),
            "target_s": t_target, "drafter_s": t_drafter, "step_s": step_s,
            "target_idle_frac": max(0.0, 1 - t_target / step_s), "drafter_idle_frac": max(0.0, 1 - t_drafter / step_s),
            "peak_mem_bytes": _peak_mem(self.dev),
        }

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self) -> Path:
        self.status.update(phase="saving", step=self.step)
        state = {
            "step": self.step, "epoch": self.epoch, "batch_index": self.batch_index,
            "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
            "rng": {"generator": self.gen.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "args": vars(self.args), "total_steps": self.total_steps,
        }
        path = ckpt.save_checkpoint(self.ckpt_root, self.step, self.drafter.state_dict(), self.dcfg.to_dict(), state,
                                    keep=self.args.keep_checkpoints)
        self.status.update(newest_checkpoint=str(path))
        self.log(f"saved {path}")
        return path

    def evaluate(self):
        a = self.args
        path = a.eval_prompts or (Path(a.data_dir) / "eval" / "prompts.jsonl")
        if a.eval_num_prompts <= 0 or not Path(path).is_file():
            return None
        res = speculative_tau(self.producer, self.drafter, load_prompts(path, a.eval_num_prompts), a.block_size,
                              a.eval_max_new_tokens)
        res.pop("per_prompt")
        return res

    # ---- the loop ----------------------------------------------------------------------------
    def train(self, metrics: MetricsLog, wandb_run, on_step=None) -> str:
        a = self.args
        self.status.update(phase="training", step=self.step, epoch=self.epoch)
        last_saved = self.step
        while self.step < self.total_steps and not self.stop_requested:
            rec = self.train_step()
            metrics.write(rec)
            wandb_run.log(rec, self.step)
            if not self.status.state["ready"]:
                notify.ready(f"training, step {self.step}")
                self.status.update(ready=True)
            notify.watchdog()
            if self.step % a.log_interval == 0 or self.step == self.total_steps:
                self.log(f"step {self.step}/{self.total_steps} ep {rec['epoch']:.3f} loss {rec['loss']:.4f} "
                         f"ce {rec['ce']:.4f} acc1 {rec['acc'][0]:.3f} proxy {rec['accept_proxy']:.2f} "
                         f"lr {rec['lr']:.2e} target {rec['target_tokens_per_s']:.0f} tok/s "
                         f"drafter {rec['drafter_rows_per_s']:.0f} rows/s")
            if on_step is not None:
                on_step(self)
            if self.step % a.save_interval == 0 and not self.stop_requested:
                self.save()
                last_saved = self.step
            self.status.update(phase="training", step=self.step, epoch=self.epoch)
        if self.step > last_saved or (self.step > 0 and ckpt.newest_complete(self.ckpt_root) is None):
            self.save()
        if self.stop_requested:
            return "stopped"
        res = self.evaluate()
        if res is not None:
            metrics.write({"step": self.step, **res})
            wandb_run.log({"tau": res["tau"]}, self.step)
            self.log(f"acceptance length tau {res['tau']:.3f} over {res['prompts']} prompts "
                     f"(block {a.block_size}, {res['cycles']} cycles)")
        return "completed"


def run(args, log=print, on_step=None) -> int:
    """Preflight, then train. ConfigError propagates (the CLI turns it into exit 78)."""
    plan = preflight(args)
    if args.check:
        for line in plan.summary:
            log("check: " + line)
        log("check: ok")
        return 0
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    status = Status(out)
    status.update(phase="loading")
    trainer = Trainer(args, plan, status, log)
    previous = signal.signal(signal.SIGTERM, trainer.request_stop)
    metrics = wandb_run = None
    try:
        trainer.setup()
        (out / "run_config.json").write_text(json.dumps(vars(args), indent=1, default=str) + "\n")
        metrics = MetricsLog(out)
        wandb_run = wandb_compat.WandbRun(args.wandb_project, args.wandb_run_name, plan.wandb_settings,
                                          vars(args), out)
        phase = trainer.train(metrics, wandb_run, on_step)
        status.update(phase=phase, step=trainer.step, epoch=trainer.epoch)
        wandb_run.finish()
        log(f"{phase} at step {trainer.step}")
        return 0
    except BaseException as e:
        status.update(phase="failed", step=trainer.step, last_error=f"{type(e).__name__}: {e}".splitlines()[0])
        if wandb_run is not None:
            wandb_run.finish(exit_code=1)
        raise
    finally:
        if metrics is not None:
            metrics.close()
        signal.signal(signal.SIGTERM, previous)
