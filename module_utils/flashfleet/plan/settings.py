"""The run's settings: RunConfig, the one definition of every setting of `dflash-train`, grouped in
sections that own their fields (topology, data, drafter, loss, checkpoints, eval, logging, ...).

Each field has its type, default, one-line doc, bounds or choices (`setting`); its name is flat
and unique across sections, and it is that flat name the inventory's `trainer:` entry and the
run's JSON (`/etc/flashfleet/runs/<run>.json`) use: sections are how the code groups and reads
them, never a nesting of the file. Standard library only: the controller's plan (plan_run) and the
trainer (its command line, its checks, --help and docs/trainer.md's flag table) both read it.

    cfg = RunConfig.from_flat({"target_model": "/m", "lr": 3e-4})   # every other field its default
    cfg.optimisation.lr, cfg.lr                                         # 3e-4 both: a section, or flat
    cfg.replace(lr=1e-4)                                                # a copy: cfg is frozen
    FIELDS["lr"].metadata["ge"], SECTION_OF["lr"]                       # its bounds, 'optimisation'
"""

import dataclasses
import types
from dataclasses import dataclass

from .defaults import (
    BLOCK_SIZE,
    DECAY_GAMMAS,
    DFLASH2,
    DRAFT_SAMPLE_METHODS,
    DRAFTER_KINDS,
    HYBRID_DRAFTER,
    MOE_MLP_PER_HIDDEN,
    RANDOM_DRAFTER_LAYERS,
    SPARE_MASK_ROWS,
    THINKING_SWITCH,
)


def setting(default, doc: str, *, ge=None, gt=None, le=None, lt=None, choices=None,
            note: str = "", example=None, fix: str = "", metavar: str | None = None, required: bool = False,
            most=None):
    """One field of a section. `ge`/`gt`/`le`/`lt` bound a number (None: unbounded on that side),
    `most` is the largest value the libraries take (a limit of the implementation, not of the meaning),
    `choices` a string; `note` names what a special value means ("0 = off"), shown after the range;
    the refusal of an out-of-range value says `fix`, else suggests `example` (default: the default).
    Its group (the --help heading) is its section's title."""
    return dataclasses.field(default=default, metadata=dict(
        doc=doc, ge=ge, gt=gt, le=le, lt=lt, choices=choices, note=note,
        example=default if example is None else example, fix=fix, metavar=metavar, required=required,
        most=most))


def section(title: str):
    """Class decorator: a frozen dataclass of settings whose --help heading is `title`."""
    def make(cls):
        for f in vars(cls).values():
            if isinstance(f, dataclasses.Field):
                f.metadata = types.MappingProxyType({**f.metadata, "group": title})
        cls = dataclass(frozen=True)(cls)
        cls.TITLE = title
        return cls
    return make


DROP = "drop it for the target's default"
# Defaults that torch-importing modules apply, stated from their owner (defaults.py).
HYBRID = "for a Qwen3.5/3.6 target"
MASK_ROWS = ", ".join(f"{row} for the {vocab:,}-row {family} vocab" for family, (vocab, row) in SPARE_MASK_ROWS.items())
GAMMAS = ", ".join(f"{g:g} for block >= {b}" for b, g in DECAY_GAMMAS[:-1]) + f", else {DECAY_GAMMAS[-1][1]:g}"
EVAL = "evaluation (real acceptance length tau, greedy or sampled speculative decoding)"
SPECULATORS = "speculators 0.9.0's DFlash2SpeculatorConfig default"


@section("paths")
class Paths:
    config: str | None = setting(
        None, "JSON object of field names -> values; explicit command-line flags override it", metavar="PATH.json")
    target_model: str | None = setting(
        None, "local directory of the frozen target (transformers format; never downloaded)", required=True)
    data_dir: str | None = setting(
        None, "directory of *.parquet files: `input_ids` list<int>, optional `loss_mask` list<int> "
        "(1 = supervised), same lengths", required=True)
    output_dir: str | None = setting(
        None, "run directory: metrics.jsonl, status.json, checkpoints/", required=True)


@section("topology")
class Topology:
    target_gpus: str = setting(
        "0", "comma-separated GPU indices, one target worker process each, extracting hidden states for "
        "its share of the micro-batches; or `cpu` entries (`cpu,cpu` = two CPU workers)")
    drafter_gpus: str = setting(
        "0", "comma-separated GPU indices, one data-parallel drafter rank each (gradients all-reduced); "
        "or `cpu` entries")
    queue_depth: int = setting(
        0, "micro-batches of hidden states each drafter rank keeps requested ahead (bounds the queue)", ge=0, note="0 = auto: max(2, 2 x targets / drafters)")
    target_servers: str | None = setting(
        None, "vLLM servers (http://HOST:PORT, writing to this host's /dev/shm) that compute the target "
        "instead of target workers: a target larger than one GPU, with vLLM's own tensor and data "
        "parallelism; each started with this run's settings (--serve-config prints them); --target-gpus "
        "is then unused", metavar="URL[,URL...]")
    server_gpus: int = setting(
        1, "GPUs each of --target-servers uses (its vLLM tensor-parallel x data-parallel size): --plan "
        "splits the node into servers of N GPUs and drafter GPUs; --check prints the target's weights "
        "per server GPU", ge=1, metavar="N",
        fix="pass each vLLM server's tensor-parallel x data-parallel size, e.g. --server-gpus 2")
    server_check_every: int = setting(
        0, "with --target-servers: at the first micro-batch and every N after, compare one sequence's "
        "features from the server with this process's own target on --server-check-device (loaded "
        "once; where the target fits there) and fail on a relative error above --server-check-tol", ge=0, note="0 = never", metavar="N", example=500)
    server_check_device: str = setting(
        "cpu", "where --server-check-every's target runs: `cpu` or one GPU index")
    server_check_tol: float = setting(
        0.02, "largest relative L2 error of a checked sequence's features (bf16 engines differ by about "
        "1e-2, fp32 by 1e-6)", ge=0, metavar="R")
    target_server_wait: float = setting(
        900.0, "seconds a start waits for --target-servers that do not answer yet (a server restarting "
        "after a crash reloads its target), before it fails; --check does not wait", ge=0, metavar="S", example=900)
    drafter_serves_target: bool = setting(
        False, "each drafter rank also loads a target replica on its own device and, while it would wait "
        "for hidden states, serves the node's next request itself (the drafter's GPU stops idling in a "
        "target-bound split; it needs room for a replica beside the drafter)")
    nnodes: int = setting(
        1, "nodes in the run; each runs one dflash-train with the same flags except --node-rank", ge=1)
    node_rank: int = setting(
        0, "this node's rank, 0..nnodes-1; node 0 hosts the rendezvous store and global rank 0 "
        "(checkpoints, metrics, wandb)")
    rdzv_endpoint: str | None = setting(
        None, "c10d TCPStore rendezvous: node 0 listens on PORT, the others connect to HOST:PORT "
        "(default: $MASTER_ADDR:$MASTER_PORT; required when --nnodes > 1)",
        metavar="HOST:PORT")
    rdzv_timeout: float = setting(
        300.0, "seconds to wait for all nodes to join", gt=0, example=300)
    node_timeout: float = setting(
        30.0, "a node whose heartbeat stops for this many seconds takes the run down (every node exits "
        "with an error naming it)", gt=0, example=30)


@section("optimisation")
class Optimisation:
    epochs: float = setting(1.0, "passes over the data (fractions allowed)", gt=0,
                            example=1)
    max_steps: int | None = setting(None, "stop after this many optimizer steps (default: epochs)", ge=1, fix="drop it or raise it")
    lr: float = setting(6e-4, "peak AdamW learning rate", gt=0, lt=1)
    warmup_ratio: float = setting(0.04, "linear warmup as a fraction of all steps, then cosine decay to 0", ge=0, lt=1)
    weight_decay: float = setting(0.01, "AdamW decoupled weight decay", ge=0,
                                  note="0 = none")
    grad_accum: int = setting(1, "micro-batches per optimizer step", ge=1)
    grad_clip: float = setting(1.0, "global grad-norm clip", ge=0, note="0 = off")
    # most: torch.manual_seed overflows past 64 bits (after --check said ok); 32 bits every seeded
    # library here takes.
    seed: int = setting(0, "seeds init, shuffling (with the epoch), anchors and noise",
                        ge=0, most=2**32 - 1)


@section("data and packing")
class Data:
    token_budget: int = setting(65536, "max tokens per micro-batch (sum of packed sequence lengths; "
                                ">= --max-seq-len)", ge=2)
    max_seq_len: int = setting(8192, "sequences are truncated to this many tokens (<= --token-budget)", ge=2)
    max_batch_size: int = setting(64, "max sequences per micro-batch", ge=1)
    max_anchors: int = setting(
        512, "max anchors (= draft blocks) per MICRO-BATCH, not per sequence: spread over its sequences in "
        "proportion to their number of valid anchor positions (speculators' semantics); each anchor "
        "trains block-size rows", ge=1)


@section("drafter")
class Drafter:
    block_size: int | None = setting(
        None, "tokens per draft block (anchor + block-size-1 predictions); default: per --drafter-kind, "
        f"dflash {BLOCK_SIZE['dflash']} (z-lab's published DFlash drafters), dflash2 {BLOCK_SIZE['dflash2']} (the "
        "published Qwen3.8-27B DFlash 2, speculators 0.9.0's dflash2 default)", ge=2, example=16)
    num_draft_layers: int = setting(
        5, f"drafter decoder layers (dflash-eval --random-drafter: {RANDOM_DRAFTER_LAYERS} unless given, since an untrained "
        "drafter's tau does not grow with its depth and fewer layers evaluate faster)", ge=1)
    target_layers: str | None = setting(
        None, "comma-separated target decoder-layer indices whose OUTPUTS feed the drafter (0-based: layer "
        "i = HF hidden_states[i+1]); default: num-draft-layers spread evenly over 1..L-3")
    mask_token_id: int | None = setting(
        None, "embedding row used for masked block positions, a spare row of the target's vocabulary "
        f"(default: {MASK_ROWS}, else vocab_size-1)", ge=0, fix=DROP)
    attn_impl: str = setting(
        "auto", "drafter attention: flex (torch flex_attention, compiled, computing only the score tiles "
        "the block mask allows), dense (SDPA with the full boolean mask, the reference), or auto (flex on "
        "a CUDA drafter, dense on CPU)", choices=("auto", "dense", "flex"))
    target_compile: str = setting(
        "auto", "auto: each decoder layer of a CUDA target compiled with torch.compile, which fuses the "
        "memory-bound ops around its GEMMs (compiled at the first micro-batch; a hybrid stack's "
        "linear-attention layers in parts, around flash-linear-attention's kernels); off: transformers' "
        "eager forward everywhere", choices=("auto", "off"))
    drafter_layer_types: str | None = setting(
        None, "per draft layer full_attention|sliding_attention (or full|sliding, `sliding*4,full`); "
        "default: all full for a Qwen3 target, sliding x (layers-1) then full for a Qwen3.5/3.6 target "
        "(the published Qwen3.6-27B drafter)", metavar="LIST")
    sliding_window: int | None = setting(
        None, "sliding_attention layers: a query at position p sees keys k <= p with p-k < W, context and "
        f"block alike (causal in the block); default {HYBRID_DRAFTER['sliding_window']} {HYBRID}", ge=1,
        metavar="W", fix=DROP)
    drafter_num_heads: int | None = setting(
        None, f"drafter query heads (default: the target's; {HYBRID_DRAFTER['num_attention_heads']} {HYBRID})",
        ge=1, fix=DROP)
    drafter_num_kv_heads: int | None = setting(
        None, f"drafter KV heads, dividing the query heads (default: the target's; "
        f"{HYBRID_DRAFTER['num_key_value_heads']} {HYBRID})", ge=1, fix=DROP)
    drafter_head_dim: int | None = setting(
        None, f"drafter head dim (default: the target's; {HYBRID_DRAFTER['head_dim']} {HYBRID})",
        ge=1, fix=DROP)
    drafter_intermediate_size: int | None = setting(
        None, f"drafter MLP width (default: the target's intermediate_size, {MOE_MLP_PER_HIDDEN} x hidden for a MoE target)", ge=1, fix=DROP)
    allow_slow_linear_attention: bool = setting(
        False, "start a GPU run of a hybrid (Gated-DeltaNet) target even though transformers would run its "
        "linear-attention layers through the slow torch fallback (flash-linear-attention not importable); "
        "--check refuses it otherwise")
    drafter_kind: str = setting(
        "dflash", "dflash: the DFlash drafter; dflash2: DFlash 2, the same backbone with a grouped dynamic "
        "causal convolution around each attention and MLP sublayer and a low-rank candidate selector that "
        "reranks each position's top-k tokens (vLLM >= 0.32 serves it as DFlash2DraftModel; docs/trainer.md)", choices=DRAFTER_KINDS)
    conv_kernel_size: int = setting(
        DFLASH2["conv_kernel_size"], f"dflash2: taps of each convolution, within a block ({SPECULATORS}); "
        "at most --block-size", ge=1)
    conv_group_size: int = setting(
        DFLASH2["conv_group_size"], f"dflash2: hidden channels sharing one dynamic kernel ({SPECULATORS}); "
        "must divide the target's hidden size", ge=1)
    selector_rank: int = setting(
        DFLASH2["selector_rank"], f"dflash2: rank of the selector's predecessor/successor codebooks ({SPECULATORS})", ge=1)
    selector_top_k: int = setting(
        DFLASH2["selector_top_k"], f"dflash2: unary candidates the selector reranks per position ({SPECULATORS}); "
        "at most the vocabulary", ge=1)


@section("loss")
class Loss:
    ce_target: str = setting(
        "target-argmax", "what the CE term's label is at each supervised row: target-argmax (the target's most "
        "likely token there: what a greedy target accepts; the target's final state and its logits are then "
        "computed, as for soft labels) or data (the data set's token: the target's forward stops at its deepest "
        "feature layer); combines with --use-soft-labels. The default is measured: docs/trainer.md",
        choices=("data", "target-argmax"))
    use_soft_labels: bool = setting(
        True, "add KL to the target's distribution (--no-use-soft-labels: CE alone); with target-argmax labels "
        "the loss takes them from the same teacher logits. The default is measured: docs/trainer.md")
    kl_temperature: float = setting(1.0, "softmax temperature T of the KL term", gt=0)
    kl_weight: float = setting(0.5, "w in loss = w*T^2*KL + (1-w)*CE (only with --use-soft-labels)", ge=0, le=1, example=0.7)
    loss_weighting: str = setting(
        "streak", "per-block-position weights: streak (expected accepted tokens depending on the position), "
        "decay exp(-(k-1)/gamma), or uniform", choices=("streak", "decay", "uniform"))
    streak_alpha: float = setting(0.5, "streak smoothing: q -> (1-alpha)*q + alpha", ge=0, le=1)
    decay_gamma: float | None = setting(
        None, f"decay gamma (default, DFlash's: {GAMMAS})", gt=0,
        fix=f"e.g. {DECAY_GAMMAS[0][1]:g} for block {DECAY_GAMMAS[0][0]}, or drop it")
    selector_loss_alpha: float = setting(
        DFLASH2["selector_loss_alpha"], "dflash2: loss = unary loss + alpha x the selector's K-way CE over the "
        "unary top-k (speculators 0.9.0's selector_loss_alpha default)", ge=0)
    noise_start: float = setting(0.0, "hidden-state noise scale at step 0, relative to each token's RMS", ge=0, note="0 = no noise", example=0.1)
    noise_end: float = setting(0.0, "noise scale at the last step (cosine anneal)", ge=0,
                               note="0 = no noise", example=0.01)
    loss_impl: str = setting(
        "auto", "auto: the Triton kernel on a CUDA drafter, flashfleet_kernels' torch reference on CPU; "
        "triton: insist on the kernel; torch: the reference everywhere",
        choices=("auto", "triton", "torch"))
    teacher_fp8: bool = setting(
        False, "the fused loss's teacher logits from an FP8 GEMM (row-wise scales, the frozen head quantized "
        "once): about 12% less loss time on an H100/H200, the teacher distribution slightly coarser "
        "(docs/benchmarks.md); needs --use-soft-labels and a CUDA drafter")


@section("checkpoints")
class Checkpoints:
    save_interval: int = setting(1000, "checkpoint every N optimizer steps (and at the end)", ge=1)
    keep_checkpoints: int = setting(3, "keep the newest K complete checkpoints", ge=0,
                                    note="0 = keep all")
    resume: str = setting("auto", "auto (newest complete checkpoint, if any), never, or a checkpoint PATH")
    init_from: str | None = setting(
        None, "start from the weights of a DFlash drafter directory (dflash-export's OUT_DIR, or a published "
        "drafter: config.json + model.safetensors) when no checkpoint is resumed; it must be the drafter "
        "this run builds (block size, draft layers, target layers, mask id, the target's hidden size and "
        "vocab)", metavar="DIR")


@section(EVAL)
class Eval:
    eval_prompts: str | None = setting(
        None, "JSONL of {\"input_ids\": [...]}; must exist when given (default: <data-dir>/eval/prompts.jsonl "
        "if present)")
    eval_num_prompts: int = setting(32, "prompts to evaluate at the end", ge=0,
                                    note="0 = no evaluation")
    eval_max_new_tokens: int = setting(64, "tokens generated per evaluation prompt", ge=1)
    eval_interval: int = setting(
        500, "also measure tau every N optimizer steps on the first --eval-interval-prompts held-out prompts "
        "(per set), into metrics.jsonl and wandb; in every layout: a target worker evaluates for the "
        "drafter ranks, with vLLM servers rank 0 borrows a replica; docs/trainer.md gives its cost", ge=0, note="0 = at the end only")
    eval_interval_prompts: int = setting(8, "prompts per set of each interval evaluation", ge=1)
    eval_temperature: float = setting(
        0.0, "> 0: the evaluations sample at this temperature (speculative sampling); on a weak target, "
        "whose greedy continuations loop, 1 shows the train/serve gap greedy hides", ge=0,
        note="0 = greedy", example=1)
    eval_top_p: float = setting(
        1.0, "when sampling: the smallest top set of the target's (and a DFlash drafter's) distribution "
        "whose mass reaches P, after --eval-top-k (z-lab's dflash protocol)", gt=0, le=1,
        note="1 = all", example=0.95)
    eval_top_k: int = setting(
        0, "when sampling: only the K most likely tokens, before --eval-top-p (z-lab's dflash protocol)", ge=0, note="0 = all", example=20)
    eval_draft_sample_method: str = setting(
        "probabilistic", "when sampling: how the drafter's tokens are drawn: probabilistic (from its "
        "distribution, which the acceptance test reads: z-lab's dflash protocol) or greedy (its most likely "
        "token, treated as certain: what vLLM serves by default, draft_sample_method='greedy'; each draft is "
        "then accepted with the target's probability of it)", choices=DRAFT_SAMPLE_METHODS)
    eval_thinking: str = setting(
        "on", "the chat template's thinking switch (`enable_thinking`, Qwen3.x templates) for prompts given "
        "as messages; on as the published Qwen3.5/3.6/3.8 drafter evaluations, off for non-thinking "
        "drafters (z-lab's Qwen3-4B/8B)", choices=THINKING_SWITCH)


@section("logging")
class Logging:
    wandb_project: str | None = setting(None, "log to wandb too (metrics.jsonl is always written)")
    wandb_run_name: str | None = setting(None, "the wandb run's name")
    wandb_settings: str | None = setting(None, "JSON object passed to wandb.Settings; validated by --check")
    log_interval: int = setting(1, "print a progress line every N steps", ge=1)


@section("actions")
class Actions:
    check: bool = setting(False, "validate everything that can be validated without training, print a "
                          "summary and exit 0, or exit 78 with one line naming the problem")
    serve_config: bool = setting(
        False, "print, as JSON, what a vLLM target server for this run needs, then exit: `argv` (the "
        "extraction method, its layers, flashfleet's connector) and `layers` (the vLLM layer ids, for "
        "dflash-vllm-probe)")
    plan: bool = setting(False, "measure a few steps of target and drafter on the first device of each, "
                         "print the split of the node's devices that maximises drafter rows/s, exit 0")
    plan_steps: int = setting(3, "measured steps for --plan (after one warm-up step)", ge=1)


@dataclass(frozen=True)
class RunConfig:
    """A run's settings, one section each; `cfg.NAME` reads a field by its flat name too."""
    paths: Paths = dataclasses.field(default_factory=Paths)
    topology: Topology = dataclasses.field(default_factory=Topology)
    optimisation: Optimisation = dataclasses.field(default_factory=Optimisation)
    data: Data = dataclasses.field(default_factory=Data)
    drafter: Drafter = dataclasses.field(default_factory=Drafter)
    loss: Loss = dataclasses.field(default_factory=Loss)
    checkpoints: Checkpoints = dataclasses.field(default_factory=Checkpoints)
    eval: Eval = dataclasses.field(default_factory=Eval)
    logging: Logging = dataclasses.field(default_factory=Logging)
    actions: Actions = dataclasses.field(default_factory=Actions)

    def __getattr__(self, name: str):
        # Only reached when `name` is no section: a field by its flat name.
        if name in SECTION_OF:
            return getattr(getattr(self, SECTION_OF[name]), name)
        raise AttributeError(f"RunConfig has no section or setting {name!r}")

    @classmethod
    def from_flat(cls, values: dict) -> "RunConfig":
        """The instance holding `values` (flat names; every other field its default). Raises
        KeyError naming a name that is no field."""
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise KeyError(", ".join(unknown))
        return cls(**{s: SECTIONS[s](**{k: v for k, v in values.items() if SECTION_OF[k] == s}) for s in SECTIONS})

    def to_flat(self) -> dict:
        """{flat name: value} of every field, in definition order."""
        return {name: getattr(self, name) for name in FIELDS}

    def replace(self, **values) -> "RunConfig":
        """A copy with `values` (flat names) changed; the instance itself never changes."""
        return RunConfig.from_flat({**self.to_flat(), **values})


# section attribute -> its class, and every field by its flat name (in --help's order).
SECTIONS = {f.name: f.type for f in dataclasses.fields(RunConfig)}
SECTION_OF = {f.name: s for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
FIELDS = {f.name: f for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
assert len(SECTION_OF) == len(FIELDS) == sum(len(dataclasses.fields(c)) for c in SECTIONS.values()), "a name twice"


def base_type(f: dataclasses.Field) -> type:
    """int for `int | None`, str for `str`, ..."""
    if isinstance(f.type, types.UnionType):
        return next(t for t in f.type.__args__ if t is not type(None))
    return f.type
