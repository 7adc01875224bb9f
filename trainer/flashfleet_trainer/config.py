"""The command line of `dflash-train`: every flag of the real run, plus `--config PATH.json`.

A systemd unit runs `dflash-train --config /etc/flashfleet/runs/<run>.json`; the JSON object's
keys are the flags' dest names ("target_model", "use_soft_labels": true, ...). Flags given
explicitly on the command line override the JSON. Deterministic configuration problems raise
ConfigError, which the CLI prints as ONE line and turns into exit code 78 (EX_CONFIG), the code
the unit is told not to restart on.
"""

import argparse
import json
import math
import os
import sys

from flashfleet.contract import messages

EX_CONFIG = messages.EX_CONFIG


class ConfigError(Exception):
    """A deterministic configuration or start-up error: retrying cannot help, a human must fix it."""

    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.what, self.fix = what, fix

    def line(self) -> str:
        return messages.config_error(self.what, self.fix)


class TargetServerError(RuntimeError):
    """A vLLM target server (--target-servers) is unreachable, failed, or handed back features the
    run must not train on: exit 1, so the unit's restart resumes once the server answers again."""


class UnreachableServerError(TargetServerError):
    """The server did not answer at all (not started yet, restarting, or dead)."""


EX_NONFINITE = messages.EX_NONFINITE


class NonFiniteLoss(Exception):
    """The loss (or gradient norm) of an optimizer step was NaN or infinite: the run stops without
    saving that state; the CLI prints line() and exits EX_NONFINITE."""

    def __init__(self, step: int, value: float, what: str = "loss"):
        super().__init__(messages.nonfinite_loss(step, value, what))
        self.step, self.value, self.what = step, value, what

    def line(self) -> str:
        return str(self)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors (unknown flag, missing or malformed value) are ConfigErrors: one
    line and exit 78 like every other refused start, not argparse's usage block and exit 2."""

    def error(self, message):
        raise ConfigError(message, "see dflash-train --help")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="dflash-train",
        description="Train a DFlash block-diffusion drafter on hidden states of a frozen target model.",
        epilog="Exit codes: 0 finished, or stopped by SIGTERM after saving a checkpoint; 78 configuration "
               "error, including a malformed command line (one line on stderr); 65 the loss or gradient norm "
               "became NaN or infinite (one line on stderr; no checkpoint of that state is saved); anything "
               "else is a crash with a traceback.",
    )
    a = p.add_argument_group("paths")
    a.add_argument("--config", metavar="PATH.json", help="JSON object of flag dest names -> values; "
                   "explicit command-line flags override it")
    a.add_argument("--target-model", help="local directory of the frozen target (transformers format; never downloaded)")
    a.add_argument("--data-dir", help="directory of *.parquet files: `input_ids` list<int>, optional `loss_mask` "
                   "list<int> (1 = supervised), same lengths")
    a.add_argument("--output-dir", help="run directory: metrics.jsonl, status.json, checkpoints/")

    t = p.add_argument_group("topology")
    t.add_argument("--target-gpus", default="0", help="comma-separated GPU indices, one target worker process "
                   "each, extracting hidden states for its share of the micro-batches; or `cpu` entries "
                   "(`cpu,cpu` = two CPU workers)")
    t.add_argument("--drafter-gpus", default="0", help="comma-separated GPU indices, one data-parallel drafter "
                   "rank each (gradients all-reduced); or `cpu` entries")
    t.add_argument("--queue-depth", type=int, default=0, help="micro-batches of hidden states each drafter rank "
                   "keeps requested ahead (bounds the queue; 0 = auto: max(2, 2 x targets / drafters))")
    t.add_argument("--target-servers", default=None, metavar="URL[,URL...]",
                   help="vLLM servers (http://HOST:PORT, writing to this host's /dev/shm) that compute the target "
                        "instead of target workers: a target larger than one GPU, with vLLM's own tensor and data "
                        "parallelism; each started with this run's settings (--serve-config prints them); "
                        "--target-gpus is then unused")
    t.add_argument("--server-gpus", type=int, default=1, metavar="N",
                   help="GPUs each of --target-servers uses (its vLLM tensor-parallel x data-parallel size, "
                        ">= 1): --plan splits the node into servers of N GPUs and drafter GPUs; --check prints "
                        "the target's weights per server GPU")
    t.add_argument("--server-check-every", type=int, default=0, metavar="N",
                   help="with --target-servers: at the first micro-batch and every N after, compare one sequence's "
                        "features from the server with this process's own target on --server-check-device "
                        "(loaded once; where the target fits there) and fail on a relative error above "
                        "--server-check-tol (0 = never)")
    t.add_argument("--server-check-device", default="cpu", help="where --server-check-every's target runs: `cpu` "
                   "or one GPU index")
    t.add_argument("--server-check-tol", type=float, default=0.02, metavar="R",
                   help="largest relative L2 error of a checked sequence's features (bf16 engines differ by "
                        "about 1e-2, fp32 by 1e-6)")
    t.add_argument("--target-server-wait", type=float, default=900.0, metavar="S",
                   help="seconds a start waits for --target-servers that do not answer yet (a server restarting "
                        "after a crash reloads its target), before it fails (>= 0; --check does not wait)")
    t.add_argument("--drafter-serves-target", action="store_true",
                   help="each drafter rank also loads a target replica on its own device and, while it would "
                        "wait for hidden states, serves the node's next request itself (the drafter's GPU "
                        "stops idling in a target-bound split; it needs room for a replica beside the drafter)")
    t.add_argument("--nnodes", type=int, default=1, help="nodes in the run; each runs one dflash-train with the "
                   "same flags except --node-rank")
    t.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1; node 0 hosts the "
                   "rendezvous store and global rank 0 (checkpoints, metrics, wandb)")
    t.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="c10d TCPStore rendezvous: node 0 listens on PORT, the others connect to HOST:PORT "
                        "(default: $MASTER_ADDR:$MASTER_PORT; required when --nnodes > 1)")
    t.add_argument("--rdzv-timeout", type=float, default=300.0, help="seconds to wait for all nodes to join (> 0)")
    t.add_argument("--node-timeout", type=float, default=30.0, help="a node whose heartbeat stops for this many "
                   "seconds (> 0) takes the run down (every node exits with an error naming it)")

    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=float, default=1.0, help="passes over the data (> 0, fractions allowed)")
    o.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps (>= 1; default: epochs)")
    o.add_argument("--lr", type=float, default=6e-4, help="peak AdamW learning rate, in (0, 1)")
    o.add_argument("--warmup-ratio", type=float, default=0.04, help="linear warmup as a fraction of all steps, in [0, 1), then cosine decay to 0")
    o.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decoupled weight decay (>= 0)")
    o.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (>= 1)")
    o.add_argument("--grad-clip", type=float, default=1.0, help="global grad-norm clip (>= 0; 0 = off)")
    o.add_argument("--seed", type=int, default=0, help="seeds init, shuffling (with the epoch), anchors and noise (>= 0)")

    d = p.add_argument_group("data and packing")
    d.add_argument("--token-budget", type=int, default=65536, help="max tokens per micro-batch (sum of packed sequence lengths; >= --max-seq-len)")
    d.add_argument("--max-seq-len", type=int, default=8192, help="sequences are truncated to this many tokens (>= 2, <= --token-budget)")
    d.add_argument("--max-batch-size", type=int, default=64, help="max sequences per micro-batch (>= 1)")
    d.add_argument("--max-anchors", type=int, default=512,
                   help="max anchors (= draft blocks, >= 1) per MICRO-BATCH, not per sequence: spread over its sequences "
                        "in proportion to their number of valid anchor positions (speculators' semantics); each "
                        "anchor trains block-size rows")

    m = p.add_argument_group("drafter")
    m.add_argument("--block-size", type=int, default=16, help="tokens per draft block (anchor + block-size-1 predictions; >= 2)")
    m.add_argument("--num-draft-layers", type=int, default=5, help="drafter decoder layers (>= 1)")
    m.add_argument("--target-layers", default=None,
                   help="comma-separated target decoder-layer indices whose OUTPUTS feed the drafter (0-based: "
                        "layer i = HF hidden_states[i+1]); default: num-draft-layers spread evenly over 1..L-3")
    m.add_argument("--mask-token-id", type=int, default=None,
                   help="embedding row (>= 0) used for masked block positions, a spare row of the target's vocabulary "
                        "(default: 151669 for the 151,936-row Qwen3 vocab, 248070 for the 248,320-row Qwen3.5/3.6 "
                        "vocab, else vocab_size-1)")
    m.add_argument("--attn-impl", choices=("auto", "dense", "flex"), default="auto",
                   help="drafter attention: flex (torch flex_attention, compiled, computing only the score tiles "
                        "the block mask allows), dense (SDPA with the full boolean mask, the reference), or auto "
                        "(flex on a CUDA drafter, dense on CPU)")
    m.add_argument("--target-compile", choices=("auto", "off"), default="auto",
                   help="auto: each decoder layer of a CUDA target compiled with torch.compile, which fuses "
                        "the memory-bound ops around its GEMMs (compiled at the first micro-batch; a hybrid "
                        "stack's linear-attention layers in parts, around flash-linear-attention's kernels); "
                        "off: transformers' eager forward everywhere")
    m.add_argument("--drafter-layer-types", default=None, metavar="LIST",
                   help="per draft layer full_attention|sliding_attention (or full|sliding, `sliding*4,full`); "
                        "default: all full for a Qwen3 target, sliding x (layers-1) then full for a Qwen3.5/3.6 "
                        "target (the published Qwen3.6-27B drafter)")
    m.add_argument("--sliding-window", type=int, default=None, metavar="W",
                   help="sliding_attention layers (W >= 1): a query at position p sees keys k <= p with p-k < W, context "
                        "and block alike (causal in the block); default 2048 for a Qwen3.5/3.6 target")
    m.add_argument("--drafter-num-heads", type=int, default=None,
                   help="drafter query heads (>= 1; default: the target's; 32 for a Qwen3.5/3.6 target)")
    m.add_argument("--drafter-num-kv-heads", type=int, default=None,
                   help="drafter KV heads (>= 1, dividing the query heads; default: the target's; 8 for a Qwen3.5/3.6 target)")
    m.add_argument("--drafter-head-dim", type=int, default=None,
                   help="drafter head dim (>= 1; default: the target's; 128 for a Qwen3.5/3.6 target)")
    m.add_argument("--drafter-intermediate-size", type=int, default=None,
                   help="drafter MLP width (>= 1; default: the target's intermediate_size, 3 x hidden for a MoE target)")
    m.add_argument("--allow-slow-linear-attention", action="store_true",
                   help="start a GPU run of a hybrid (Gated-DeltaNet) target even though transformers would run "
                        "its linear-attention layers through the slow torch fallback (flash-linear-attention "
                        "not importable); --check refuses it otherwise")

    lo = p.add_argument_group("loss")
    lo.add_argument("--use-soft-labels", action="store_true", help="add KL to the target's distribution")
    lo.add_argument("--kl-temperature", type=float, default=1.0, help="softmax temperature T of the KL term (> 0)")
    lo.add_argument("--kl-weight", type=float, default=0.5, help="loss = w*T^2*KL + (1-w)*CE, w in [0, 1] (only with --use-soft-labels)")
    lo.add_argument("--loss-weighting", choices=("streak", "decay", "uniform"), default="streak",
                    help="per-block-position weights: streak (expected accepted tokens depending on the position), "
                         "decay exp(-(k-1)/gamma), or uniform")
    lo.add_argument("--streak-alpha", type=float, default=0.5, help="streak smoothing: q -> (1-alpha)*q + alpha, alpha in [0, 1]")
    lo.add_argument("--decay-gamma", type=float, default=None, help="decay gamma (> 0; default 7 for block 16, 5 for 10, 4 for 8)")
    lo.add_argument("--noise-start", type=float, default=0.0, help="hidden-state noise scale at step 0, relative to each token's RMS (>= 0)")
    lo.add_argument("--noise-end", type=float, default=0.0, help="noise scale at the last step (>= 0, cosine anneal)")
    lo.add_argument("--loss-impl", choices=("auto", "triton", "torch"), default="auto",
                    help="auto: the Triton kernel on a CUDA drafter, flashfleet_kernels' torch reference on CPU; "
                         "triton: insist on the kernel; torch: the reference everywhere")
    lo.add_argument("--teacher-fp8", action="store_true",
                    help="the fused loss's teacher logits from an FP8 GEMM (row-wise scales, the frozen head "
                         "quantized once): about 12%% less loss time on an H100/H200, the teacher distribution "
                         "slightly coarser (docs/benchmarks.md); needs --use-soft-labels and a CUDA drafter")

    c = p.add_argument_group("checkpoints")
    c.add_argument("--save-interval", type=int, default=1000, help="checkpoint every N >= 1 optimizer steps (and at the end)")
    c.add_argument("--keep-checkpoints", type=int, default=3, help="keep the newest K complete checkpoints (0 = keep all)")
    c.add_argument("--resume", default="auto", help="auto (newest complete checkpoint, if any), never, or a checkpoint PATH")
    c.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from the weights of a DFlash drafter directory (dflash-export's OUT_DIR, or a "
                        "published drafter: config.json + model.safetensors) when no checkpoint is resumed; it "
                        "must be the drafter this run builds (block size, draft layers, target layers, mask id, "
                        "the target's hidden size and vocab)")

    e = p.add_argument_group("evaluation (real acceptance length tau, greedy speculative decoding)")
    e.add_argument("--eval-prompts", default=None, help="JSONL of {\"input_ids\": [...]}; must exist when given (default: <data-dir>/eval/prompts.jsonl if present)")
    e.add_argument("--eval-num-prompts", type=int, default=32, help="prompts to evaluate at the end (>= 0; 0 = no evaluation)")
    e.add_argument("--eval-max-new-tokens", type=int, default=64, help="tokens generated per evaluation prompt (>= 1)")
    e.add_argument("--eval-interval", type=int, default=500, help="also measure tau every N optimizer steps on the "
                   "first --eval-interval-prompts held-out prompts (per set), into metrics.jsonl and wandb (>= 0; "
                   "0 = at the end only; in every layout: a target worker evaluates for the drafter ranks, with vLLM servers "
                   "rank 0 borrows a replica; docs/trainer.md gives its cost)")
    e.add_argument("--eval-interval-prompts", type=int, default=8, help="prompts per set of each interval evaluation (>= 1)")
    e.add_argument("--eval-temperature", type=float, default=0.0, help="0 = greedy (default); > 0: the evaluations "
                   "sample at this temperature (speculative sampling; >= 0); on a weak target, whose greedy "
                   "continuations loop, 1 shows the train/serve gap greedy hides")

    w = p.add_argument_group("logging")
    w.add_argument("--wandb-project", default=None, help="log to wandb too (metrics.jsonl is always written)")
    w.add_argument("--wandb-run-name", default=None)
    w.add_argument("--wandb-settings", default=None, help="JSON object passed to wandb.Settings; validated by --check")
    w.add_argument("--log-interval", type=int, default=1, help="print a progress line every N >= 1 steps")

    p.add_argument("--check", action="store_true", help="validate everything that can be validated without training, "
                   "print a summary and exit 0, or exit 78 with one line naming the problem")
    p.add_argument("--serve-config", action="store_true", help="print, as JSON, what a vLLM target server for "
                   "this run needs, then exit: `argv` (the extraction method, its layers, flashfleet's connector) "
                   "and `layers` (the vLLM layer ids, for dflash-vllm-probe)")
    p.add_argument("--plan", action="store_true", help="measure a few steps of target and drafter on the first "
                   "device of each, print the split of the node's devices that maximises drafter rows/s, exit 0")
    p.add_argument("--plan-steps", type=int, default=3, help="measured steps for --plan (>= 1, after one warm-up step)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """argv -> Namespace with --config merged underneath explicit flags. Raises ConfigError."""
    parser = build_parser()
    argv = numbers_as_values(parser, list(sys.argv[1:] if argv is None else argv))
    first = parser.parse_args(argv)
    if first.config:
        try:
            with open(first.config) as f:
                values = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read --config {first.config}: {e}", "point --config at a readable JSON file") from e
        if not isinstance(values, dict):
            raise ConfigError(f"--config {first.config} is not a JSON object", "write {\"flag_dest\": value, ...}")
        known = {act.dest for act in parser._actions} - {"help", "config"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown key(s) in --config: {', '.join(unknown)}",
                              "use flag dest names such as target_model, use_soft_labels")
        for key in sorted(act.dest for act in parser._actions if isinstance(act, argparse._StoreTrueAction)):
            if key in values and not isinstance(values[key], bool):
                raise ConfigError(f"--config key {key} must be true or false", f"write \"{key}\": true")
        if isinstance(values.get("wandb_settings"), dict):
            values["wandb_settings"] = json.dumps(values["wandb_settings"])
        parser.set_defaults(**{k: (str(v) if k in ("target_layers", "target_gpus", "drafter_gpus")
                                   and not isinstance(v, str) else v) for k, v in values.items()})
        first = parser.parse_args(argv)
    for req in ("target_model", "data_dir", "output_dir"):
        if not getattr(first, req):
            raise ConfigError(f"--{req.replace('_', '-')} is required", f"pass it or set \"{req}\" in --config")
    validate_types(parser, first)
    validate_numbers(first)
    return first


def numbers_as_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--lr -1e-3` -> `--lr=-1e-3`: a number after a flag that takes one value is that value.

    argparse reads `-1e-3` (but not `-1`) as an unknown option; joined, the value reaches
    validate_numbers, whose message names the flag and its range."""
    takes_value = {s for act in parser._actions if act.nargs is None and act.option_strings
                   for s in act.option_strings}
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return out + argv[i:]
        if tok in takes_value and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            try:
                float(argv[i + 1])
            except ValueError:
                pass
            else:
                out.append(f"{tok}={argv[i + 1]}")
                i += 2
                continue
        out.append(tok)
        i += 1
    return out


def validate_types(parser: argparse.ArgumentParser, args) -> None:
    """--config values bypass argparse's conversion (a JSON string is converted, a list, a bool or
    null is not): every numeric flag must hold a number of its type, every choice one of its
    choices."""
    for act in parser._actions:
        if not act.option_strings or act.dest in ("help", "config"):
            continue
        v, flag = getattr(args, act.dest, None), act.option_strings[0]
        if v is None and act.default is None:
            continue
        if act.type is int and (isinstance(v, bool) or not isinstance(v, int)):
            if isinstance(v, float) and v.is_integer():
                setattr(args, act.dest, int(v))
                continue
            raise ConfigError(f"{flag} {v!r} is not an integer", f"pass {flag} as a whole number")
        if act.type is float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"{flag} {v!r} is not a number", f"pass {flag} as a number, e.g. {act.default}")
            setattr(args, act.dest, float(v))
        if act.choices is not None and v not in act.choices:
            raise ConfigError(f"{flag} {v!r} is not one of {', '.join(act.choices)}",
                              f"pass {flag} {next(iter(act.choices))}")


def validate_numbers(args) -> None:
    """Every numeric flag's range (the rules the flags' help states). Raises ConfigError naming the
    flag, the value given and its range."""

    def need(cond, what, fix):
        if not cond:
            raise ConfigError(what, fix)

    for dest in ("epochs", "lr", "warmup_ratio", "weight_decay", "grad_clip", "kl_temperature", "kl_weight",
                 "streak_alpha", "decay_gamma", "noise_start", "noise_end", "rdzv_timeout", "node_timeout",
                 "eval_temperature", "target_server_wait", "server_check_tol"):
        v = getattr(args, dest, None)
        flag = "--" + dest.replace("_", "-")
        need(v is None or math.isfinite(v), f"{flag} {v} is not a finite number", f"pass {flag} as a finite number")

    def at_least(dest, low, fix, optional=False):
        v = getattr(args, dest, None)
        if v is None and optional:
            return
        flag = "--" + dest.replace("_", "-")
        need(v >= low, f"{flag} {v}: must be >= {low}", fix)

    def above(dest, low, fix, optional=False):
        v = getattr(args, dest, None)
        if v is None and optional:
            return
        flag = "--" + dest.replace("_", "-")
        need(v > low, f"{flag} {v}: must be > {low}", fix)

    at_least("block_size", 2, "use 8 or 16")
    at_least("num_draft_layers", 1, "use e.g. 5")
    at_least("grad_accum", 1, "use 1 or more")
    at_least("token_budget", 2, "e.g. --token-budget 65536")
    at_least("max_seq_len", 2, "e.g. --max-seq-len 8192")
    at_least("max_batch_size", 1, "e.g. --max-batch-size 64")
    at_least("max_anchors", 1, "e.g. --max-anchors 512")
    at_least("max_steps", 1, "drop it or raise it", optional=True)
    at_least("save_interval", 1, "e.g. 1000")
    at_least("keep_checkpoints", 0, "e.g. 3 (0 keeps all)")
    at_least("log_interval", 1, "e.g. 1 or 10")
    at_least("seed", 0, "e.g. 0")
    at_least("eval_num_prompts", 0, "e.g. 32 (0 = no evaluation)")
    at_least("eval_max_new_tokens", 1, "e.g. 64")
    at_least("eval_interval", 0, "e.g. 500 (0 = at the end only)")
    at_least("eval_interval_prompts", 1, "e.g. 8")
    at_least("eval_temperature", 0, "e.g. 0 (greedy) or 1")
    at_least("queue_depth", 0, "e.g. --queue-depth 0 (auto)")
    at_least("target_server_wait", 0, "e.g. --target-server-wait 900")
    at_least("server_check_every", 0, "e.g. --server-check-every 500 (0 = never)")
    at_least("server_check_tol", 0, "e.g. --server-check-tol 0.02")
    at_least("server_gpus", 1, "pass each vLLM server's tensor-parallel x data-parallel size, e.g. --server-gpus 2")
    at_least("plan_steps", 1, "e.g. 3")
    at_least("nnodes", 1, "e.g. 1")
    at_least("mask_token_id", 0, "drop it for the target's default spare row", optional=True)
    for dest in ("sliding_window", "drafter_num_heads", "drafter_num_kv_heads", "drafter_head_dim",
                 "drafter_intermediate_size"):
        at_least(dest, 1, f"drop --{dest.replace('_', '-')} for the target's default", optional=True)
    above("epochs", 0, "e.g. --epochs 1")
    above("kl_temperature", 0, "e.g. 1.0")
    above("decay_gamma", 0, "e.g. 7 for block 16, or drop it", optional=True)
    above("rdzv_timeout", 0, "e.g. 300")
    above("node_timeout", 0, "e.g. 30")
    at_least("weight_decay", 0, "e.g. 0.01 (0 = none)")
    at_least("grad_clip", 0, "e.g. 1.0 (0 = off)")
    at_least("noise_start", 0, "e.g. 0.1 (0 = no noise)")
    at_least("noise_end", 0, "e.g. 0.01 (0 = no noise)")
    need(0.0 < args.lr < 1.0, f"--lr {args.lr}: must be in (0, 1)", "e.g. --lr 6e-4")
    need(0.0 <= args.warmup_ratio < 1.0, f"--warmup-ratio {args.warmup_ratio}: must be in [0, 1)", "e.g. 0.04")
    need(0.0 <= args.kl_weight <= 1.0, f"--kl-weight {args.kl_weight}: must be in [0, 1]", "e.g. 0.7")
    need(0.0 <= args.streak_alpha <= 1.0, f"--streak-alpha {args.streak_alpha}: must be in [0, 1]", "e.g. 0.5")
    need(args.max_seq_len <= args.token_budget, f"--max-seq-len {args.max_seq_len} exceeds --token-budget "
         f"{args.token_budget}: such sequences could never be packed", "raise --token-budget or lower --max-seq-len")
    need(args.nnodes >= 1 and 0 <= args.node_rank < args.nnodes, f"--node-rank {args.node_rank} is not in "
         f"0..{args.nnodes - 1} (--nnodes {args.nnodes})", "number the nodes 0..nnodes-1")
    if args.nnodes > 1 or args.rdzv_endpoint:
        endpoint = args.rdzv_endpoint
        if not endpoint and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        host, _, port = (endpoint or "").rpartition(":")
        need(bool(host) and port.isdigit() and 0 < int(port) < 65536, f"--rdzv-endpoint {endpoint!r} is not "
             "HOST:PORT", "pass --rdzv-endpoint node0.example:29400 (or set MASTER_ADDR and MASTER_PORT)")
        args.rdzv_endpoint = endpoint
    need(args.resume in ("auto", "never") or os.path.isdir(args.resume), f"--resume {args.resume}: not auto, "
         "never, or an existing checkpoint directory", "pass auto, never, or checkpoints/step-XXXXXXXX")
    init_from = getattr(args, "init_from", None)
    need(init_from is None or os.path.isdir(init_from), f"--init-from {init_from}: not a directory",
         "pass a DFlash drafter directory (config.json + model.safetensors), e.g. dflash-export's OUT_DIR")


def parse_devices(spec: str, flag: str) -> list[str]:
    """'cpu' -> ['cpu']; 'cpu,cpu' -> ['cpu', 'cpu'] (two CPU workers); '0,1,2' -> ['cuda:0', 'cuda:1', 'cuda:2'].

    CPU entries may repeat because each entry is a process, and tests need several on one machine;
    a GPU index may not, because two processes of the same role on one GPU only fight for it.
    """
    spec = str(spec).strip()
    parts = [x.strip().lower() for x in spec.split(",") if x.strip() != ""]
    if parts and all(x == "cpu" for x in parts):
        return ["cpu"] * len(parts)
    try:
        ids = [int(x) for x in spec.split(",") if x.strip() != ""]
    except ValueError as e:
        raise ConfigError(f"{flag} {spec!r} is not `cpu` or a comma-separated list of GPU indices",
                          f"e.g. {flag} 0,1,2 or {flag} cpu") from e
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise ConfigError(f"{flag} {spec!r}: need distinct non-negative GPU indices", f"e.g. {flag} 0,1")
    return [f"cuda:{i}" for i in ids]
