"""Everything `--check` validates, and the Plan a run starts from.

`preflight(args)` is the first thing every start runs, so a deterministic start-up error is the
same one-line ConfigError (exit 78) whether `--check` finds it on the controller or the unit
finds it on the host. It loads no weights: config.json (a composite config through its
text_config; `model.SUPPORTED_TARGETS`), the safetensors index and the headers of the shards a
replica would load (never their data; a wrapped checkpoint's vision shards are not even opened),
the data's schema, devices, free memory, the linear-attention path of a hybrid target, the
drafter's shape, wandb's settings, the loss implementation and the output directory.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import wandb_compat
from .config import ConfigError, parse_devices
from .data import check_schema
from .loss import get_loss_fn
from .model import (
    DrafterConfig,
    check_target_config,
    checkpoint_tensors,
    default_mask_token_id,
    default_target_layers,
    flex_available,
    frozen_io_names,
    is_hybrid,
    is_wrapped,
    linear_attention_kernels,
    resolve_attn_impl,
    supported_targets_line,
    text_tensor_files,
)


@dataclass(kw_only=True)
class Plan:
    """What preflight found: the facts the trainer starts from."""

    target_config: object  # transformers config (None in spawned ranks, which need only drafter_config)
    layer_ids: list  # 0-based target decoder layers whose outputs are the drafter's features
    mask_token_id: int
    target_devices: list  # this node's, e.g. ["cuda:0", "cuda:1"] or ["cpu"]
    drafter_devices: list
    data_files: list
    data_rows: int
    wandb_settings: dict
    summary: list  # the lines `--check` prints
    drafter_config: DrafterConfig = None
    vocab_size: int = 0

    def in_process(self, args) -> bool:
        """One target and one drafter sharing a device on one node: no processes needed."""
        return (args.nnodes == 1 and len(self.target_devices) == 1 and len(self.drafter_devices) == 1
                and self.target_devices[0] == self.drafter_devices[0])


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


class _DrafterFlags:
    """args, with the drafter-shape flags None where a caller's Namespace lacks them."""

    def __init__(self, args):
        self._a = args

    def __getattr__(self, name):
        return getattr(self._a, name, None)


@dataclass
class TargetWeights:
    """What the safetensors headers say about the weights a run loads (no data is read)."""

    params: int  # elements of the tensors loaded
    nbytes: int  # their stored bytes
    wrapped: bool  # language model under model.language_model.* (a multimodal wrapper)
    skipped: int  # tensors left on disk (vision tower, MTP head)
    shapes: dict  # {name: shape} of the loaded tensors


def target_weights(model_dir: Path) -> TargetWeights | None:
    """The loaded tensors' sizes from the headers of the shards that hold them (only those are
    read, 8 bytes + a JSON header each); None without safetensors. ConfigError on a shard the
    index names that is missing or whose header is broken or does not match its size."""
    from flashfleet.contract.safetensors import read_header

    try:
        names = checkpoint_tensors(model_dir)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--target-model {model_dir}: unreadable safetensors index ({e})",
                          "re-stage the model") from e
    if not names:
        return None
    wrapped = is_wrapped(names)
    files = text_tensor_files(names) if wrapped else {}
    if not wrapped:
        for name, f in names.items():
            files.setdefault(f, []).append(name)
    params = nbytes = 0
    shapes = {}
    for f, keys in sorted(files.items()):
        tensors, problems = read_header(model_dir / f)
        missing = [k for k in keys if k not in tensors]
        if problems or missing:
            what = problems[0] if problems else f"its header lacks {missing[0]} (the index puts it there)"
            raise ConfigError(f"--target-model {model_dir}: shard {f}: {what}", "re-stage the model")
        for k in keys:
            t = tensors[k]
            n = 1
            for dim in t["shape"]:
                n *= dim
            params, nbytes, shapes[k] = params + n, nbytes + t["nbytes"], t["shape"]
    return TargetWeights(params=params, nbytes=nbytes, wrapped=wrapped, skipped=len(names) - len(shapes), shapes=shapes)


def check_mask_token(model_dir: Path, mask_id: int, vocab_size: int) -> str:
    """The mask id must be a row of the target's embedding and, where the target ships a
    tokenizer.json, not one of its ordinary (BPE) tokens: a spare row, as the published drafters
    use (an added special token is allowed). Returns what was checked, for the summary."""
    if not 0 <= mask_id < vocab_size:
        raise ConfigError(f"--mask-token-id {mask_id} is not a row of the target's {vocab_size}-row embedding",
                          "pick a spare row of the target vocabulary")
    tok = model_dir / "tokenizer.json"
    if not tok.is_file():
        return "no tokenizer.json: not checked against the tokenizer"
    try:
        t = json.loads(tok.read_text())
        added = {int(a["id"]): a.get("content") for a in t.get("added_tokens") or []}
        vocab = (t.get("model") or {}).get("vocab") or {}
        regular = {int(i): w for w, i in vocab.items()} if isinstance(vocab, dict) else {}
    except (OSError, ValueError, TypeError, KeyError) as e:
        return f"tokenizer.json unreadable ({e}): not checked against the tokenizer"
    if mask_id in regular and mask_id not in added:
        raise ConfigError(f"--mask-token-id {mask_id} is the ordinary token {regular[mask_id]!r} of the target's "
                          "tokenizer, not a spare row", "pick a row past the tokenizer's tokens "
                          f"({default_mask_token_id(vocab_size)} for this vocabulary size if it is spare)")
    if mask_id in added:
        return f"the tokenizer's added token {added[mask_id]!r}, not an ordinary token"
    return f"a spare row (not a token of the tokenizer's {len(regular) + len(added)})"


def check_linear_attention(text_cfg, target_devices, allow_slow: bool) -> str:
    """Which path a hybrid target's Gated-DeltaNet layers will take on this host, as transformers
    bound it: flash-linear-attention's Triton kernels, or the torch reference. A GPU target on
    the torch path is refused (several times slower, silently) unless allow_slow; a CPU target
    needs the torch path (fla's kernels are GPU-only)."""
    if not is_hybrid(text_cfg):
        return ""
    k = linear_attention_kernels(text_cfg)
    rule, conv = k["chunk_gated_delta_rule"], k["causal_conv1d_fn"]
    gpu = any(d != "cpu" for d in target_devices)
    if gpu and rule == "torch" and not allow_slow:
        raise ConfigError("the target's Gated-DeltaNet layers would run on the torch fallback on GPU "
                          "(flash-linear-attention is not importable here): several times slower than its kernels",
                          "install flash-linear-attention (it is in the cuda profile's lock) or pass "
                          "--allow-slow-linear-attention")
    if not gpu and rule != "torch":
        raise ConfigError(f"a CPU target but transformers bound {rule} (flash-linear-attention) for the "
                          "Gated-DeltaNet layers, whose Triton kernels run on GPU only",
                          "run the target on a GPU, or use a venv without flash-linear-attention for CPU runs")
    n_lin = sum(t == "linear_attention" for t in text_cfg.layer_types)
    where = "GPU" if gpu else "CPU"
    rule_s = f"flash-linear-attention ({rule})" if rule != "torch" else "torch reference (slow)"
    conv_s = f"causal-conv1d ({conv})" if conv != "torch" else "torch conv1d"
    return (f"linear attention ({n_lin} Gated-DeltaNet layers) on {where}: delta rule {rule_s}, short conv "
            f"{conv_s}" + (" (allowed by --allow-slow-linear-attention)" if gpu and rule == "torch" else ""))


def drafter_config(args, tcfg, layer_ids, mask_id) -> DrafterConfig:
    """The drafter this run builds: the target's defaults (`model.drafter_defaults`) and the flags.
    Flags absent from `args` (an older Namespace) count as not given."""
    args = _DrafterFlags(args)
    for flag, v in (("--sliding-window", args.sliding_window), ("--drafter-num-heads", args.drafter_num_heads),
                    ("--drafter-num-kv-heads", args.drafter_num_kv_heads), ("--drafter-head-dim", args.drafter_head_dim),
                    ("--drafter-intermediate-size", args.drafter_intermediate_size)):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} must be >= 1, not {v}", f"drop {flag} for the target's default")
    try:
        dcfg = DrafterConfig.from_target(
            tcfg, num_draft_layers=args.num_draft_layers, target_layer_ids=layer_ids, block_size=args.block_size,
            mask_token_id=mask_id, target_model=args.target_model, layer_types=args.drafter_layer_types,
            sliding_window=args.sliding_window, num_attention_heads=args.drafter_num_heads,
            num_key_value_heads=args.drafter_num_kv_heads, head_dim=args.drafter_head_dim,
            intermediate_size=args.drafter_intermediate_size)
    except ValueError as e:
        raise ConfigError(f"--drafter-layer-types / --sliding-window: {e}",
                          "give one of full|sliding per draft layer, and --sliding-window W with sliding layers") from e
    if args.sliding_window is not None and "sliding_attention" not in dcfg.layer_types:
        raise ConfigError(f"--sliding-window {args.sliding_window} but no draft layer is sliding_attention "
                          f"({dcfg.layer_types})", "drop --sliding-window or pass --drafter-layer-types")
    if dcfg.num_attention_heads % dcfg.num_key_value_heads:
        raise ConfigError(f"drafter heads {dcfg.num_attention_heads} not a multiple of KV heads "
                          f"{dcfg.num_key_value_heads}", "pick --drafter-num-heads divisible by --drafter-num-kv-heads")
    return dcfg


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
                          f"use a transformers model directory of a supported architecture ({supported_targets_line()})"
                          ) from e
    try:
        text = check_target_config(tcfg)
    except ValueError as e:
        raise ConfigError(str(e), "point --target-model at a Qwen3 or Qwen3.5/3.6 model directory") from e
    weights = target_weights(model_dir)
    if weights is None and not _model_bytes(model_dir):
        raise ConfigError(f"--target-model {model_dir}: no *.safetensors or *.bin weights", "stage the weights too")
    for attr in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        if not getattr(text, attr, None):
            raise ConfigError(f"target model type {tcfg.model_type!r} has no {attr}", "use a decoder-only LM (Qwen3 first)")
    h, n_layers, vocab = text.hidden_size, text.num_hidden_layers, text.vocab_size
    if weights is not None:
        embed_name, head_name = frozen_io_names(weights.shapes)
        tied = bool(getattr(text, "tie_word_embeddings", False))
        for role, name in (("embedding", embed_name), ("LM head", head_name if not tied else embed_name)):
            if name is None:
                raise ConfigError(f"--target-model {model_dir}: no {role} tensor in the checkpoint "
                                  f"({'embed_tokens.weight' if role == 'embedding' else 'lm_head.weight'})",
                                  "stage the complete model")
            if list(weights.shapes[name]) != [vocab, h]:
                raise ConfigError(f"--target-model {model_dir}: {name} is {weights.shapes[name]}, not [{vocab}, {h}] "
                                  "as config.json says", "stage the model whose config.json this is")
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
    mask_id = default_mask_token_id(vocab) if args.mask_token_id is None else args.mask_token_id
    mask_note = check_mask_token(model_dir, mask_id, vocab)
    kinds = getattr(text, "layer_types", None) or []
    stack = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds)) if kinds else "all full attention"
    summary.append(f"target {model_dir} ({tcfg.model_type}" + (f", text {text.model_type}" if text is not tcfg else "")
                   + f", {n_layers} layers: {stack}, hidden {h}, vocab {vocab}); features from decoder layers "
                   f"{layer_ids} (output of layer i = HF hidden_states[i+1]); mask id {mask_id}: {mask_note}")
    if weights is not None:
        layout = ("multimodal wrapper: language model model.language_model.* + lm_head.* loaded, "
                  f"{weights.skipped} other tensor(s) (vision tower, MTP) never read") if weights.wrapped else \
            "language model at the top level"
        size = f"{weights.params / 1e9:.2f}B" if weights.params >= 1e8 else f"{weights.params / 1e6:.2f}M"
        summary.append(f"weights: {size} params, {weights.nbytes / 2**30:.2f} GiB stored "
                       f"({layout}); shard headers ok")

    files, rows = check_schema(args.data_dir)
    summary.append(f"data {args.data_dir}: {len(files)} Parquet file(s), {rows} rows, schema ok")
    eval_prompts = getattr(args, "eval_prompts", None)
    if eval_prompts and not Path(eval_prompts).is_file():
        raise ConfigError(f"--eval-prompts {eval_prompts}: no such file (evaluation would be skipped silently)",
                          "point it at a JSONL of {\"input_ids\": [...]} or drop it")

    target_devices = parse_devices(args.target_gpus, "--target-gpus")
    drafter_devices = parse_devices(args.drafter_gpus, "--drafter-gpus")
    if args.nnodes > 1 and "cpu" in drafter_devices and "cpu" not in target_devices:
        raise ConfigError("--drafter-gpus cpu with GPU targets", "put targets and drafters on the same kind of device")
    cuda = [d for d in target_devices + drafter_devices if d != "cpu"]
    if cuda:
        have = torch.cuda.device_count()
        top = max(int(d.split(":")[1]) for d in cuda)
        if top >= have:
            raise ConfigError(f"GPU {top} requested (--target-gpus {args.target_gpus} --drafter-gpus "
                              f"{args.drafter_gpus}) but {have} CUDA device(s) are visible",
                              "request only visible GPUs, or `cpu` for both")
    world = args.nnodes * len(drafter_devices)
    summary.append(f"topology: {len(target_devices)} target worker(s) on {','.join(target_devices)}; "
                   f"{len(drafter_devices)} drafter rank(s) on {','.join(drafter_devices)} per node; "
                   f"{args.nnodes} node(s), {world} drafter rank(s) in all; "
                   f"{args.grad_accum * world} micro-batches per optimizer step")

    linear = check_linear_attention(text, target_devices, getattr(args, "allow_slow_linear_attention", False))
    if linear:
        summary.append(linear)
    dcfg = drafter_config(args, tcfg, layer_ids, mask_id)
    kinds = ", ".join(f"{dcfg.layer_types.count(k)} {k}" for k in dict.fromkeys(dcfg.layer_types))
    summary.append(f"drafter: {dcfg.num_hidden_layers} layers ({kinds}" + (f", window {dcfg.sliding_window}"
                   if dcfg.sliding_window else "") + f"), hidden {dcfg.hidden_size}, {dcfg.num_attention_heads}/"
                   f"{dcfg.num_key_value_heads} heads of {dcfg.head_dim}, MLP {dcfg.intermediate_size}, block "
                   f"{dcfg.block_size}, rope theta {dcfg.rope_theta:g}")
    if getattr(args, "init_from", None):
        from .export import check_init_from

        check_init_from(args, dcfg)
        summary.append(f"init from {args.init_from}: the same drafter (config and tensor shapes match)")

    # Memory: target replicas in their compute dtype, drafter params + grads + AdamW state in fp32.
    if weights is not None:  # the tensors a replica loads (a wrapped checkpoint's language model only)
        params = weights.params
    else:
        stored_per_param = 2 if "16" in str(getattr(text, "dtype", None) or getattr(text, "torch_dtype", "")) else 4
        params = _model_bytes(model_dir) / stored_per_param
    drafter_params = dcfg.num_params()
    replica = params * 2 * 1.1
    for d in dict.fromkeys(d for d in target_devices if d != "cpu"):
        total = torch.cuda.get_device_properties(int(d.split(":")[1])).total_memory
        if replica > total:
            raise ConfigError(f"one target replica needs about {replica / 2**30:.1f} GiB in bf16 but {d} has "
                              f"{total / 2**30:.1f} GiB in all: a target that does not fit one GPU needs tensor "
                              "parallelism or a serving engine, which this trainer does not do yet",
                              "use GPUs with more memory or a smaller target")
    need = {}
    for d in target_devices:
        need[d] = need.get(d, 0) + params * (4 if d == "cpu" else 2) * 1.1
    for d in drafter_devices:
        need[d] = need.get(d, 0) + drafter_params * 16
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
        raise ConfigError(f"--loss-impl triton but Triton is not importable ({e})",
                          "install the venv from its lock (triton is pinned there) or use --loss-impl auto") from e
    if args.loss_impl == "triton" and "cpu" in drafter_devices:
        raise ConfigError("--loss-impl triton on a CPU drafter: the Triton kernel runs on CUDA only",
                          "use --loss-impl auto (the kernel on CUDA, its torch reference on CPU) or torch")
    attn = getattr(args, "attn_impl", "auto")
    if attn == "flex" and "cpu" in drafter_devices:
        raise ConfigError("--attn-impl flex on a CPU drafter: torch's flex_attention has no backward on CPU",
                          "use --attn-impl auto or dense with --drafter-gpus cpu")
    if attn == "flex" and not flex_available():
        raise ConfigError(f"--attn-impl flex but torch {torch.__version__} has no flex_attention",
                          "use --attn-impl auto or dense, or a torch with torch.nn.attention.flex_attention")
    summary.append(f"drafter attention: {resolve_attn_impl(attn, drafter_devices[0])} (--attn-impl {attn})")

    out = Path(args.output_dir)
    probe = out  # the nearest existing ancestor decides whether the run can create its directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise ConfigError(f"--output-dir {out} is not writable", "create it or fix its ownership")
    return Plan(target_config=tcfg, layer_ids=layer_ids, mask_token_id=mask_id, target_devices=target_devices,
                drafter_devices=drafter_devices, data_files=files, data_rows=rows, wandb_settings=settings,
                summary=summary, drafter_config=dcfg, vocab_size=vocab)
