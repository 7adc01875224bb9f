"""The run configuration of `dflash-train`: one typed definition, and everything derived from it.

`RunConfig` below is the definition: one field per setting, with its type, default, one-line doc,
bounds or choices and group. The command line (`build_parser`), `--config PATH.json` loading,
`--help`, the range checks (`check_bounds`) and the flag table of docs/trainer.md (`markdown_table`)
are all generated from it; the rules that relate two settings are in `check_rules`.

A systemd unit runs `dflash-train --config /etc/flashfleet/runs/<run>.json`; the JSON object's
keys are the fields' names ("target_model", "use_soft_labels": true, ...). Flags given explicitly
on the command line override the JSON. Deterministic configuration problems raise ConfigError,
which the CLI prints as ONE line and turns into exit code 78 (EX_CONFIG), the code the unit is
told not to restart on.

Who reads what: the orchestration modules (trainer.py's Trainer and run_rank, preflight.py,
topology.py, planner.py, launch.py) read the whole parsed configuration, as one training script
would. Every other module reads a view: a frozen dataclass declared next to its code with
@settings_view, listing exactly the fields it reads under RunConfig's names and types
(evaluate.EvalSettings, feed.FeedSettings, target.TargetSettings, vllm_target.VllmSettings); the
caller builds it once with `view(cls, args)` and passes it on.
"""

import argparse
import dataclasses
import difflib
import json
import math
import os
import sys
import types
from dataclasses import dataclass

from .chat_template import THINKING_SWITCH
from .defaults import (
    DECAY_GAMMAS,
    DFLASH2,
    DRAFTER_KINDS,
    HYBRID_DRAFTER,
    MOE_MLP_PER_HIDDEN,
    RANDOM_DRAFTER_LAYERS,
    SPARE_MASK_ROWS,
)
from .errors import CliParser, ConfigError

# ---- the definition ------------------------------------------------------------------------------

def setting(default, doc: str, *, group: str, ge=None, gt=None, le=None, lt=None, choices=None,
            note: str = "", example=None, fix: str = "", metavar: str | None = None, required: bool = False,
            most=None):
    """One field of RunConfig. `ge`/`gt`/`le`/`lt` bound a number (None: unbounded on that side),
    `most` is the largest value the libraries take (a limit of the implementation, not of the meaning),
    `choices` a string; `note` names what a special value means ("0 = off"), shown after the range;
    the refusal of an out-of-range value says `fix`, else suggests `example` (default: the default)."""
    return dataclasses.field(default=default, metadata=dict(
        doc=doc, group=group, ge=ge, gt=gt, le=le, lt=lt, choices=choices, note=note,
        example=default if example is None else example, fix=fix, metavar=metavar, required=required,
        most=most))


DROP = "drop it for the target's default"
# Defaults that torch-importing modules apply, stated from their owner (defaults.py).
HYBRID = "for a Qwen3.5/3.6 target"
MASK_ROWS = ", ".join(f"{row} for the {vocab:,}-row {family} vocab" for family, (vocab, row) in SPARE_MASK_ROWS.items())
GAMMAS = ", ".join(f"{g:g} for block >= {b}" for b, g in DECAY_GAMMAS[:-1]) + f", else {DECAY_GAMMAS[-1][1]:g}"
EVAL = "evaluation (real acceptance length tau, greedy or sampled speculative decoding)"
SPECULATORS = "speculators 0.9.0's DFlash2SpeculatorConfig default"


@dataclass
class RunConfig:
    # paths
    config: str | None = setting(
        None, "JSON object of field names -> values; explicit command-line flags override it",
        group="paths", metavar="PATH.json")
    target_model: str | None = setting(
        None, "local directory of the frozen target (transformers format; never downloaded)",
        group="paths", required=True)
    data_dir: str | None = setting(
        None, "directory of *.parquet files: `input_ids` list<int>, optional `loss_mask` list<int> "
        "(1 = supervised), same lengths", group="paths", required=True)
    output_dir: str | None = setting(
        None, "run directory: metrics.jsonl, status.json, checkpoints/", group="paths", required=True)

    # topology
    target_gpus: str = setting(
        "0", "comma-separated GPU indices, one target worker process each, extracting hidden states for "
        "its share of the micro-batches; or `cpu` entries (`cpu,cpu` = two CPU workers)", group="topology")
    drafter_gpus: str = setting(
        "0", "comma-separated GPU indices, one data-parallel drafter rank each (gradients all-reduced); "
        "or `cpu` entries", group="topology")
    queue_depth: int = setting(
        0, "micro-batches of hidden states each drafter rank keeps requested ahead (bounds the queue)",
        group="topology", ge=0, note="0 = auto: max(2, 2 x targets / drafters)")
    target_servers: str | None = setting(
        None, "vLLM servers (http://HOST:PORT, writing to this host's /dev/shm) that compute the target "
        "instead of target workers: a target larger than one GPU, with vLLM's own tensor and data "
        "parallelism; each started with this run's settings (--serve-config prints them); --target-gpus "
        "is then unused", group="topology", metavar="URL[,URL...]")
    server_gpus: int = setting(
        1, "GPUs each of --target-servers uses (its vLLM tensor-parallel x data-parallel size): --plan "
        "splits the node into servers of N GPUs and drafter GPUs; --check prints the target's weights "
        "per server GPU", group="topology", ge=1, metavar="N",
        fix="pass each vLLM server's tensor-parallel x data-parallel size, e.g. --server-gpus 2")
    server_check_every: int = setting(
        0, "with --target-servers: at the first micro-batch and every N after, compare one sequence's "
        "features from the server with this process's own target on --server-check-device (loaded "
        "once; where the target fits there) and fail on a relative error above --server-check-tol",
        group="topology", ge=0, note="0 = never", metavar="N", example=500)
    server_check_device: str = setting(
        "cpu", "where --server-check-every's target runs: `cpu` or one GPU index", group="topology")
    server_check_tol: float = setting(
        0.02, "largest relative L2 error of a checked sequence's features (bf16 engines differ by about "
        "1e-2, fp32 by 1e-6)", group="topology", ge=0, metavar="R")
    target_server_wait: float = setting(
        900.0, "seconds a start waits for --target-servers that do not answer yet (a server restarting "
        "after a crash reloads its target), before it fails; --check does not wait",
        group="topology", ge=0, metavar="S", example=900)
    drafter_serves_target: bool = setting(
        False, "each drafter rank also loads a target replica on its own device and, while it would wait "
        "for hidden states, serves the node's next request itself (the drafter's GPU stops idling in a "
        "target-bound split; it needs room for a replica beside the drafter)", group="topology")
    nnodes: int = setting(
        1, "nodes in the run; each runs one dflash-train with the same flags except --node-rank",
        group="topology", ge=1)
    node_rank: int = setting(
        0, "this node's rank, 0..nnodes-1; node 0 hosts the rendezvous store and global rank 0 "
        "(checkpoints, metrics, wandb)", group="topology")
    rdzv_endpoint: str | None = setting(
        None, "c10d TCPStore rendezvous: node 0 listens on PORT, the others connect to HOST:PORT "
        "(default: $MASTER_ADDR:$MASTER_PORT; required when --nnodes > 1)", group="topology",
        metavar="HOST:PORT")
    rdzv_timeout: float = setting(
        300.0, "seconds to wait for all nodes to join", group="topology", gt=0, example=300)
    node_timeout: float = setting(
        30.0, "a node whose heartbeat stops for this many seconds takes the run down (every node exits "
        "with an error naming it)", group="topology", gt=0, example=30)

    # optimisation
    epochs: float = setting(1.0, "passes over the data (fractions allowed)", group="optimisation", gt=0,
                            example=1)
    max_steps: int | None = setting(None, "stop after this many optimizer steps (default: epochs)",
                                    group="optimisation", ge=1, fix="drop it or raise it")
    lr: float = setting(6e-4, "peak AdamW learning rate", group="optimisation", gt=0, lt=1)
    warmup_ratio: float = setting(0.04, "linear warmup as a fraction of all steps, then cosine decay to 0",
                                  group="optimisation", ge=0, lt=1)
    weight_decay: float = setting(0.01, "AdamW decoupled weight decay", group="optimisation", ge=0,
                                  note="0 = none")
    grad_accum: int = setting(1, "micro-batches per optimizer step", group="optimisation", ge=1)
    grad_clip: float = setting(1.0, "global grad-norm clip", group="optimisation", ge=0, note="0 = off")
    # most: torch.manual_seed overflows past 64 bits (after --check said ok); 32 bits every seeded
    # library here takes.
    seed: int = setting(0, "seeds init, shuffling (with the epoch), anchors and noise", group="optimisation",
                        ge=0, most=2**32 - 1)

    # data and packing
    token_budget: int = setting(65536, "max tokens per micro-batch (sum of packed sequence lengths; "
                                ">= --max-seq-len)", group="data and packing", ge=2)
    max_seq_len: int = setting(8192, "sequences are truncated to this many tokens (<= --token-budget)",
                               group="data and packing", ge=2)
    max_batch_size: int = setting(64, "max sequences per micro-batch", group="data and packing", ge=1)
    max_anchors: int = setting(
        512, "max anchors (= draft blocks) per MICRO-BATCH, not per sequence: spread over its sequences in "
        "proportion to their number of valid anchor positions (speculators' semantics); each anchor "
        "trains block-size rows", group="data and packing", ge=1)

    # drafter
    block_size: int = setting(16, "tokens per draft block (anchor + block-size-1 predictions)",
                              group="drafter", ge=2, example=16)
    num_draft_layers: int = setting(
        5, f"drafter decoder layers (dflash-eval --random-drafter: {RANDOM_DRAFTER_LAYERS} unless given, since an untrained "
        "drafter's tau does not grow with its depth and fewer layers evaluate faster)", group="drafter", ge=1)
    target_layers: str | None = setting(
        None, "comma-separated target decoder-layer indices whose OUTPUTS feed the drafter (0-based: layer "
        "i = HF hidden_states[i+1]); default: num-draft-layers spread evenly over 1..L-3", group="drafter")
    mask_token_id: int | None = setting(
        None, "embedding row used for masked block positions, a spare row of the target's vocabulary "
        f"(default: {MASK_ROWS}, else vocab_size-1)", group="drafter", ge=0, fix=DROP)
    attn_impl: str = setting(
        "auto", "drafter attention: flex (torch flex_attention, compiled, computing only the score tiles "
        "the block mask allows), dense (SDPA with the full boolean mask, the reference), or auto (flex on "
        "a CUDA drafter, dense on CPU)", group="drafter", choices=("auto", "dense", "flex"))
    target_compile: str = setting(
        "auto", "auto: each decoder layer of a CUDA target compiled with torch.compile, which fuses the "
        "memory-bound ops around its GEMMs (compiled at the first micro-batch; a hybrid stack's "
        "linear-attention layers in parts, around flash-linear-attention's kernels); off: transformers' "
        "eager forward everywhere", group="drafter", choices=("auto", "off"))
    drafter_layer_types: str | None = setting(
        None, "per draft layer full_attention|sliding_attention (or full|sliding, `sliding*4,full`); "
        "default: all full for a Qwen3 target, sliding x (layers-1) then full for a Qwen3.5/3.6 target "
        "(the published Qwen3.6-27B drafter)", group="drafter", metavar="LIST")
    sliding_window: int | None = setting(
        None, "sliding_attention layers: a query at position p sees keys k <= p with p-k < W, context and "
        f"block alike (causal in the block); default {HYBRID_DRAFTER['sliding_window']} {HYBRID}", group="drafter", ge=1,
        metavar="W", fix=DROP)
    drafter_num_heads: int | None = setting(
        None, f"drafter query heads (default: the target's; {HYBRID_DRAFTER['num_attention_heads']} {HYBRID})", group="drafter",
        ge=1, fix=DROP)
    drafter_num_kv_heads: int | None = setting(
        None, f"drafter KV heads, dividing the query heads (default: the target's; "
        f"{HYBRID_DRAFTER['num_key_value_heads']} {HYBRID})", group="drafter", ge=1, fix=DROP)
    drafter_head_dim: int | None = setting(
        None, f"drafter head dim (default: the target's; {HYBRID_DRAFTER['head_dim']} {HYBRID})", group="drafter",
        ge=1, fix=DROP)
    drafter_intermediate_size: int | None = setting(
        None, f"drafter MLP width (default: the target's intermediate_size, {MOE_MLP_PER_HIDDEN} x hidden for a MoE target)",
        group="drafter", ge=1, fix=DROP)
    allow_slow_linear_attention: bool = setting(
        False, "start a GPU run of a hybrid (Gated-DeltaNet) target even though transformers would run its "
        "linear-attention layers through the slow torch fallback (flash-linear-attention not importable); "
        "--check refuses it otherwise", group="drafter")
    drafter_kind: str = setting(
        "dflash", "dflash: the DFlash drafter; dflash2: DFlash 2, the same backbone with a grouped dynamic "
        "causal convolution around each attention and MLP sublayer and a low-rank candidate selector that "
        "reranks each position's top-k tokens (vLLM >= 0.32 serves it as DFlash2DraftModel; docs/trainer.md)",
        group="drafter", choices=DRAFTER_KINDS)
    conv_kernel_size: int = setting(
        DFLASH2["conv_kernel_size"], f"dflash2: taps of each convolution, within a block ({SPECULATORS}); "
        "at most --block-size", group="drafter", ge=1)
    conv_group_size: int = setting(
        DFLASH2["conv_group_size"], f"dflash2: hidden channels sharing one dynamic kernel ({SPECULATORS}); "
        "must divide the target's hidden size", group="drafter", ge=1)
    selector_rank: int = setting(
        DFLASH2["selector_rank"], f"dflash2: rank of the selector's predecessor/successor codebooks ({SPECULATORS})",
        group="drafter", ge=1)
    selector_top_k: int = setting(
        DFLASH2["selector_top_k"], f"dflash2: unary candidates the selector reranks per position ({SPECULATORS}); "
        "at most the vocabulary", group="drafter", ge=1)

    # loss
    ce_target: str = setting(
        "data", "what the CE term's label is at each supervised row: data (the data set's token) or "
        "target-argmax (the target's most likely token there: what a greedy target accepts; its final "
        "state is then computed, as for soft labels); combines with --use-soft-labels",
        group="loss", choices=("data", "target-argmax"))
    use_soft_labels: bool = setting(False, "add KL to the target's distribution", group="loss")
    kl_temperature: float = setting(1.0, "softmax temperature T of the KL term", group="loss", gt=0)
    kl_weight: float = setting(0.5, "w in loss = w*T^2*KL + (1-w)*CE (only with --use-soft-labels)",
                               group="loss", ge=0, le=1, example=0.7)
    loss_weighting: str = setting(
        "streak", "per-block-position weights: streak (expected accepted tokens depending on the position), "
        "decay exp(-(k-1)/gamma), or uniform", group="loss", choices=("streak", "decay", "uniform"))
    streak_alpha: float = setting(0.5, "streak smoothing: q -> (1-alpha)*q + alpha", group="loss", ge=0, le=1)
    decay_gamma: float | None = setting(
        None, f"decay gamma (default, DFlash's: {GAMMAS})", group="loss", gt=0,
        fix=f"e.g. {DECAY_GAMMAS[0][1]:g} for block {DECAY_GAMMAS[0][0]}, or drop it")
    selector_loss_alpha: float = setting(
        DFLASH2["selector_loss_alpha"], "dflash2: loss = unary loss + alpha x the selector's K-way CE over the "
        "unary top-k (speculators 0.9.0's selector_loss_alpha default)", group="loss", ge=0)
    noise_start: float = setting(0.0, "hidden-state noise scale at step 0, relative to each token's RMS",
                                 group="loss", ge=0, note="0 = no noise", example=0.1)
    noise_end: float = setting(0.0, "noise scale at the last step (cosine anneal)", group="loss", ge=0,
                               note="0 = no noise", example=0.01)
    loss_impl: str = setting(
        "auto", "auto: the Triton kernel on a CUDA drafter, flashfleet_kernels' torch reference on CPU; "
        "triton: insist on the kernel; torch: the reference everywhere", group="loss",
        choices=("auto", "triton", "torch"))
    teacher_fp8: bool = setting(
        False, "the fused loss's teacher logits from an FP8 GEMM (row-wise scales, the frozen head quantized "
        "once): about 12% less loss time on an H100/H200, the teacher distribution slightly coarser "
        "(docs/benchmarks.md); needs --use-soft-labels and a CUDA drafter", group="loss")

    # checkpoints
    save_interval: int = setting(1000, "checkpoint every N optimizer steps (and at the end)",
                                 group="checkpoints", ge=1)
    keep_checkpoints: int = setting(3, "keep the newest K complete checkpoints", group="checkpoints", ge=0,
                                    note="0 = keep all")
    resume: str = setting("auto", "auto (newest complete checkpoint, if any), never, or a checkpoint PATH",
                          group="checkpoints")
    init_from: str | None = setting(
        None, "start from the weights of a DFlash drafter directory (dflash-export's OUT_DIR, or a published "
        "drafter: config.json + model.safetensors) when no checkpoint is resumed; it must be the drafter "
        "this run builds (block size, draft layers, target layers, mask id, the target's hidden size and "
        "vocab)", group="checkpoints", metavar="DIR")

    # evaluation
    eval_prompts: str | None = setting(
        None, "JSONL of {\"input_ids\": [...]}; must exist when given (default: <data-dir>/eval/prompts.jsonl "
        "if present)", group=EVAL)
    eval_num_prompts: int = setting(32, "prompts to evaluate at the end", group=EVAL, ge=0,
                                    note="0 = no evaluation")
    eval_max_new_tokens: int = setting(64, "tokens generated per evaluation prompt", group=EVAL, ge=1)
    eval_interval: int = setting(
        500, "also measure tau every N optimizer steps on the first --eval-interval-prompts held-out prompts "
        "(per set), into metrics.jsonl and wandb; in every layout: a target worker evaluates for the "
        "drafter ranks, with vLLM servers rank 0 borrows a replica; docs/trainer.md gives its cost",
        group=EVAL, ge=0, note="0 = at the end only")
    eval_interval_prompts: int = setting(8, "prompts per set of each interval evaluation", group=EVAL, ge=1)
    eval_temperature: float = setting(
        0.0, "> 0: the evaluations sample at this temperature (speculative sampling); on a weak target, "
        "whose greedy continuations loop, 1 shows the train/serve gap greedy hides", group=EVAL, ge=0,
        note="0 = greedy", example=1)
    eval_top_p: float = setting(
        1.0, "when sampling: the smallest top set of the target's (and a DFlash drafter's) distribution "
        "whose mass reaches P, after --eval-top-k (z-lab's dflash protocol)", group=EVAL, gt=0, le=1,
        note="1 = all", example=0.95)
    eval_top_k: int = setting(
        0, "when sampling: only the K most likely tokens, before --eval-top-p (z-lab's dflash protocol)",
        group=EVAL, ge=0, note="0 = all", example=20)
    eval_thinking: str = setting(
        "on", "the chat template's thinking switch (`enable_thinking`, Qwen3.x templates) for prompts given "
        "as messages; on as the published Qwen3.5/3.6/3.8 drafter evaluations, off for non-thinking "
        "drafters (z-lab's Qwen3-4B/8B)", group=EVAL, choices=THINKING_SWITCH)

    # logging
    wandb_project: str | None = setting(None, "log to wandb too (metrics.jsonl is always written)",
                                        group="logging")
    wandb_run_name: str | None = setting(None, "the wandb run's name", group="logging")
    wandb_settings: str | None = setting(None, "JSON object passed to wandb.Settings; validated by --check",
                                         group="logging")
    log_interval: int = setting(1, "print a progress line every N steps", group="logging", ge=1)

    # actions
    check: bool = setting(False, "validate everything that can be validated without training, print a "
                          "summary and exit 0, or exit 78 with one line naming the problem", group="actions")
    serve_config: bool = setting(
        False, "print, as JSON, what a vLLM target server for this run needs, then exit: `argv` (the "
        "extraction method, its layers, flashfleet's connector) and `layers` (the vLLM layer ids, for "
        "dflash-vllm-probe)", group="actions")
    plan: bool = setting(False, "measure a few steps of target and drafter on the first device of each, "
                         "print the split of the node's devices that maximises drafter rows/s, exit 0",
                         group="actions")
    plan_steps: int = setting(3, "measured steps for --plan (after one warm-up step)", group="actions", ge=1)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


# ---- views: the settings one module reads ----------------------------------------------------------

VIEWS: list[type] = []  # every class declared with @settings_view (a test checks each against RunConfig)


def settings_view(cls):
    """Class decorator: `cls`, annotated with the RunConfig fields its module reads (same names, same
    types), becomes a frozen dataclass, that module's view of the run configuration. A name that is
    no RunConfig field is refused here, when the module is imported."""
    cls = dataclass(frozen=True)(cls)
    unknown = [f.name for f in dataclasses.fields(cls) if f.name not in FIELDS]
    if unknown:
        raise TypeError(f"settings view {cls.__module__}.{cls.__qualname__} names {', '.join(unknown)}, not "
                        "RunConfig field(s): name its fields as RunConfig does, or add the setting to RunConfig")
    VIEWS.append(cls)
    return cls


def view(cls, args):
    """The view `cls` (a @settings_view class) of the parsed configuration `args`, or of a larger view
    that holds its fields: built once by the caller and passed to the module that reads it."""
    if cls not in VIEWS:
        raise TypeError(f"{cls.__qualname__} is not a settings view: declare it with @config.settings_view")
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def base_type(f: dataclasses.Field) -> type:
    """int for `int | None`, str for `str`, ..."""
    if isinstance(f.type, types.UnionType):
        return next(t for t in f.type.__args__ if t is not type(None))
    return f.type


def rule(f: dataclasses.Field) -> str:
    """The field's range as its help and its refusal state it: `>= 1`, `> 0`, `in [0, 1)`."""
    m = f.metadata
    lo, hi = (m["ge"], "[") if m["ge"] is not None else (m["gt"], "(")
    up, close = (m["le"], "]") if m["le"] is not None else (m["lt"], ")")
    if lo is not None and up is not None:
        return f"in {hi}{lo}, {up}{close}"
    if lo is not None:
        return f"{'>=' if hi == '[' else '>'} {lo}"
    if up is not None:
        return f"{'<=' if close == ']' else '<'} {up}"
    return ""


def help_text(f: dataclasses.Field) -> str:
    most = f"at most {f.metadata['most']}" if f.metadata["most"] is not None else ""
    extra = "; ".join(x for x in (rule(f), most, f.metadata["note"]) if x)
    return f.metadata["doc"] + (f" ({extra})" if extra else "")


# ---- generated: the command line ---------------------------------------------------------------



def build_parser() -> argparse.ArgumentParser:
    p = CliParser(
        prog="dflash-train",
        description="Train a DFlash block-diffusion drafter on hidden states of a frozen target model.",
        epilog="Exit codes: 0 finished, or stopped by SIGTERM after saving a checkpoint; 78 configuration "
               "error, including a malformed command line (one line on stderr); 65 the loss or gradient norm "
               "became NaN or infinite (one line on stderr; no checkpoint of that state is saved); anything "
               "else is a crash with a traceback.",
    )
    groups = {}
    for f in FIELDS.values():
        group = groups.get(f.metadata["group"]) or groups.setdefault(
            f.metadata["group"], p.add_argument_group(f.metadata["group"]))
        add_setting(group, f.name)
    return p


def add_setting(parser: argparse.ArgumentParser, name: str, *aliases: str, default=dataclasses.MISSING,
                use: str = "") -> None:
    """Another command's flag for the same setting (dflash-eval's), from the same field: its type,
    choices and doc with range; `aliases` keep that command's older names, `default` overrides the
    field's (the field's doc says why), `use` says what the setting is for there. Check the parsed
    values with check_bounds."""
    f = FIELDS[name]
    kw = dict(dest=name, default=f.default if default is dataclasses.MISSING else default,
              help=(help_text(f) + (f"; {use}" if use else "")).replace("%", "%%"))
    if base_type(f) is bool:
        kw["action"] = "store_true"
    else:
        kw["type"] = None if base_type(f) is str else base_type(f)
        kw.update({k: f.metadata[k] for k in ("choices", "metavar") if f.metadata[k] is not None})
    parser.add_argument(flag(name), *aliases, **kw)


def parse_args(argv=None) -> argparse.Namespace:
    """argv -> Namespace with --config merged underneath explicit flags. Raises ConfigError."""
    parser = build_parser()
    argv = numbers_as_values(parser, list(sys.argv[1:] if argv is None else argv))
    first = parser.parse_args(argv)
    if first.config:
        parser.set_defaults(**load_config_file(first.config))
        first = parser.parse_args(argv)
    for f in FIELDS.values():
        if f.metadata["required"] and not getattr(first, f.name):
            raise ConfigError(f"{flag(f.name)} is required", f"pass it or set \"{f.name}\" in --config")
    check_types(first)
    check_bounds(first)
    check_rules(first)
    return first


def load_config_file(path: str) -> dict:
    """--config's JSON object -> values for the parser's defaults: known keys only, each of its
    field's JSON type (argparse converts a JSON string as it converts a flag's value; its bounds are
    checked after the merge, like a flag's)."""
    try:
        with open(path) as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read --config {path}: {e}", "point --config at a readable JSON file") from e
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path} is not a JSON object", "write {\"flag_dest\": value, ...}")
    known = sorted(set(FIELDS) - {"config"})
    for key in sorted(values):
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            raise ConfigError(f"unknown key {key!r} in --config {path}",
                              f"did you mean {near[0]!r}?" if near else "use field names such as target_model, "
                              "use_soft_labels (dflash-train --help; the flag without -- and with _)")
    out = {}
    for key, v in values.items():
        want = base_type(FIELDS[key])
        if want is bool and not isinstance(v, bool):
            raise ConfigError(f"--config key {key} must be true or false", f"write \"{key}\": true")
        if want is str and v is not None and not isinstance(v, str):
            if key == "wandb_settings" and isinstance(v, dict):
                v = json.dumps(v)
            elif isinstance(v, int | float) and not isinstance(v, bool):
                v = str(v)  # "target_gpus": 0 means "0"
            else:
                raise ConfigError(f"--config key {key} {v!r} is not a string", f"write \"{key}\": \"...\"")
        out[key] = v
    return out


def numbers_as_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--lr -1e-3` -> `--lr=-1e-3`: a number after a flag that takes one value is that value.

    argparse reads `-1e-3` (but not `-1`) as an unknown option; joined, the value reaches
    check_bounds, whose message names the flag and its range."""
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


# ---- generated: the checks -----------------------------------------------------------------------

def check_types(args) -> None:
    """--config values bypass argparse's conversion (a JSON string is converted, a number, a list or
    null is not): every numeric field must hold a number of its type, every choice one of its
    choices. Integral floats become ints, ints of a float field floats."""
    for f in FIELDS.values():
        v, name, want = getattr(args, f.name, None), flag(f.name), base_type(f)
        if v is None and f.default is None:
            continue
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            if isinstance(v, float) and v.is_integer():
                setattr(args, f.name, int(v))
                continue
            raise ConfigError(f"{name} {v!r} is not an integer", f"pass {name} as a whole number")
        if want is float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"{name} {v!r} is not a number", f"pass {name} as a number, e.g. {f.default}")
            setattr(args, f.name, float(v))
        choices = f.metadata["choices"]
        if choices is not None and v not in choices:
            raise ConfigError(f"{name} {v!r} is not one of {', '.join(choices)}", f"pass {name} {choices[0]}")


def check_bounds(args) -> None:
    """Every field's own range, from its definition: a float must be finite, a bounded number inside
    its bounds (None passes where None is the default). Raises ConfigError naming the flag, the value
    and the range."""
    for f in FIELDS.values():
        v, m, name = getattr(args, f.name, None), f.metadata, flag(f.name)
        if v is None or base_type(f) not in (int, float):
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):  # `--lr=--` gives argparse's [] (dflash-eval)
            raise ConfigError(f"{name} {v!r} is not a number", f"pass {name} as a number, e.g. {m['example']}")
        if not math.isfinite(v):
            raise ConfigError(f"{name} {v} is not a finite number", f"pass {name} as a finite number")
        inside = ((m["ge"] is None or v >= m["ge"]) and (m["gt"] is None or v > m["gt"])
                  and (m["le"] is None or v <= m["le"]) and (m["lt"] is None or v < m["lt"]))
        if not inside:
            raise ConfigError(f"{name} {v}: must be {rule(f)}", m["fix"] or f"e.g. {name} {m['example']}")
        if m["most"] is not None and v > m["most"]:
            raise ConfigError(f"{name} {v}: must be {rule(f)} and at most {m['most']}", f"e.g. {name} {m['example']}")


def check_rules(args) -> None:
    """The rules that relate settings to each other or to the filesystem (a field's own range is
    check_bounds')."""

    def need(cond, what, fix):
        if not cond:
            raise ConfigError(what, fix)

    need(args.max_seq_len <= args.token_budget, f"--max-seq-len {args.max_seq_len} exceeds --token-budget "
         f"{args.token_budget}: such sequences could never be packed", "raise --token-budget or lower --max-seq-len")
    need(0 <= args.node_rank < args.nnodes, f"--node-rank {args.node_rank} is not in "
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
    need(args.init_from is None or os.path.isdir(args.init_from), f"--init-from {args.init_from}: not a directory",
         "pass a DFlash drafter directory (config.json + model.safetensors), e.g. dflash-export's OUT_DIR")


# ---- generated: the flag table of docs/trainer.md --------------------------------------------------

def markdown_table() -> str:
    """The settings as docs/trainer.md's flag table, one table per group (`python -m
    flashfleet_trainer.config --markdown` prints it; a test fails when the doc differs)."""
    out, group = [], None
    for f in FIELDS.values():
        if f.metadata["group"] != group:
            group = f.metadata["group"]
            out += ["", f"**{group}**", "", "| flag / `--config` key | type | default | range | meaning |",
                    "|---|---|---|---|---|"]
        choices = f.metadata["choices"]
        allowed = " \\| ".join(choices) if choices else "; ".join(x for x in (rule(f), f.metadata["note"]) if x)
        default = "" if f.default is None else json.dumps(f.default)
        cells = [f"`{flag(f.name)}` / `{f.name}`", base_type(f).__name__, f"`{default}`" if default else "",
                 allowed, f.metadata["doc"].replace("|", "\\|")]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out[1:]) + "\n"


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


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m flashfleet_trainer.config --markdown")
    sys.stdout.write(markdown_table())
