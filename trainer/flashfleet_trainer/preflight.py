"""Everything `--check` validates, and the Plan a run starts from.

`preflight(args)` is the first thing every start runs, so a deterministic start-up error is the
same one-line ConfigError (exit 78) whether `--check` finds it on the controller or the unit
finds it on the host. It loads no weights: config.json, file sizes, the data's schema, devices,
free memory, wandb's settings, the loss implementation and the output directory.
"""

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
    default_mask_token_id,
    default_target_layers,
    flex_available,
    resolve_attn_impl,
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

    # Memory: target replicas in their compute dtype, drafter params + grads + AdamW state in fp32.
    stored = _model_bytes(model_dir)
    stored_per_param = 2 if "16" in str(getattr(tcfg, "dtype", None) or getattr(tcfg, "torch_dtype", "")) else 4
    params = stored / stored_per_param
    h, i_sz = tcfg.hidden_size, tcfg.intermediate_size
    drafter_params = args.num_draft_layers * (4 * h * h + 3 * h * i_sz) + len(layer_ids) * h * h
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
        raise ConfigError(f"--loss-impl triton but flashfleet_kernels is not importable ({e})",
                          "install the kernels package or use --loss-impl auto") from e
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
    dcfg = DrafterConfig.from_target(tcfg, num_draft_layers=args.num_draft_layers, target_layer_ids=layer_ids,
                                     block_size=args.block_size, mask_token_id=mask_id, target_model=args.target_model)
    return Plan(target_config=tcfg, layer_ids=layer_ids, mask_token_id=mask_id, target_devices=target_devices,
                drafter_devices=drafter_devices, data_files=files, data_rows=rows, wandb_settings=settings,
                summary=summary, drafter_config=dcfg, vocab_size=tcfg.vocab_size)
