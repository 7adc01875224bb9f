"""Everything `--check` validates, and the StartFacts a run starts from.

`preflight(cfg)` runs `CHECKS`, small checks in order, each reading what the ones before it found.
It is the first thing every start runs, so a deterministic start-up error is the same one-line
ConfigError (exit 78) whether `--check` finds it on the controller or the unit finds it on the host. It loads no weights: config.json (a composite config through its
text_config; `target.SUPPORTED_TARGETS`), the safetensors index and the headers of the shards a
replica would load (never their data; a wrapped checkpoint's vision shards are not even opened),
the data's schema and values (token ids below the vocabulary, loss_mask lengths: from Parquet
column statistics where every row group has them, else a bounded scan), devices against each
other, free memory, the linear-attention path of a hybrid target, the drafter's shape, wandb's
settings and credentials, the loss implementation, the output directory and its checkpoints (the
newest verified in full, its drafter and micro-batches per step against this run's, an explicit
`--resume` path). It writes nothing: a refused start leaves every path as it was.
"""

import json
import netrc
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import torch
from flashfleet.contract import checkpoint as ckpt_contract
from flashfleet.contract.layout import CHECKPOINTS

from . import checkpoint as ckpt
from . import short_conv, wandb_compat
from .attention import flex_available, resolve_attn_impl
from .config import parse_devices
from .data import check_schema
from .defaults import DFLASH2
from .dflash2 import SHAPE as DFLASH2_SHAPE
from .dflash2 import dflash2_problem
from .drafter import DrafterConfig, default_mask_token_id
from .errors import ConfigError
from .loss import get_loss_fn
from .target import (
    QUANTIZED_FIX,
    check_target_config,
    checkpoint_tensors,
    frozen_io_names,
    is_hybrid,
    is_wrapped,
    layer_ids_problem,
    linear_attention_kernels,
    quantization_of,
    run_target_layers,
    supported_targets_line,
    text_config_of,
    text_tensor_files,
)
from .transport import nccl_transport


@dataclass(kw_only=True)
class StartFacts:
    """What preflight found: the facts the trainer starts from (nothing to do with --plan, planner.py)."""

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
    # What --resume resolved to, verified in full once here (None: --resume never); the start's
    # `prepare` and the trainer's resume use it instead of hashing the checkpoint again.
    checkpoints: ckpt.Found | None = None
    num_target_layers: int = 0  # the target's decoder layers (a vLLM server extracts the last one too)
    servers: list = field(default_factory=list)  # --target-servers: vllm_target.Server, each checked


    def in_process(self, cfg) -> bool:
        return in_process_layout(cfg.nnodes, self.target_devices, self.drafter_devices)


def in_process_layout(nnodes, target_devices, drafter_devices) -> bool:
    """One node whose one target and one drafter share a device, or whose one drafter gets its
    features from vLLM servers (no target devices): no processes needed, the drafter calls the
    target (or the servers) in-line."""
    return nnodes == 1 and len(drafter_devices) == 1 and list(target_devices) in ([], list(drafter_devices))


def check_target_servers(cfg, layer_ids, n_layers, vocab, hidden, summary) -> list:
    """--target-servers: refused with --drafter-serves-target (no replica to serve with); at a start
    or --check each server is asked for a real extraction (vllm_target.check_servers), whose lines
    join the summary; --serve-config contacts nobody. A server that cannot answer raises
    TargetServerError, not ConfigError: a start while a server restarts fails and is retried by the
    unit (exit 1), instead of being refused for good (78)."""
    from .vllm_target import check_servers, parse_servers

    if cfg.drafter_serves_target:
        raise ConfigError("--drafter-serves-target with --target-servers: the target runs in vLLM, so the "
                          "drafter has no replica to serve with", "drop --drafter-serves-target")
    try:
        parse_servers(cfg.target_servers)
    except ValueError as e:
        raise ConfigError(f"--target-servers: {e}", "e.g. --target-servers http://127.0.0.1:8100,"
                          "http://127.0.0.1:8101") from e
    if cfg.serve_config:
        return []
    # A start waits for servers that are (re)starting; --check says at once what it finds.
    wait_s = 0.0 if cfg.check else cfg.target_server_wait
    servers, lines = check_servers(cfg.target_servers, layer_ids, n_layers, cfg.max_seq_len, vocab, hidden,
                                   wait_s, log=lambda s: print(s, flush=True))
    summary.extend(lines)
    return servers


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


@dataclass
class TargetWeights:
    """What the safetensors headers say about the weights a run loads (no data is read)."""

    params: int  # elements of the tensors loaded
    nbytes: int  # their stored bytes
    wrapped: bool  # language model under model.language_model.* (a multimodal wrapper)
    skipped: int  # tensors left on disk (vision tower, MTP head)
    shapes: dict  # {name: shape} of the loaded tensors


def read_target_weights(model_dir: Path) -> TargetWeights | None:
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
    if conv == "torch" and gpu and short_conv.fla_kernel() is not None:
        conv = short_conv.KERNEL_MODULE  # bound as the target loads (target.fast_kernels)
    conv_s = "torch conv1d" if conv == "torch" else f"{conv.split('.')[0]} ({conv})"
    return (f"linear attention ({n_lin} Gated-DeltaNet layers) on {where}: delta rule {rule_s}, short conv "
            f"{conv_s}" + (" (allowed by --allow-slow-linear-attention)" if gpu and rule == "torch" else ""))


# At most this many tokens are read when Parquet statistics cannot answer (about a second per
# 10M tokens here); the rest of a larger data set is checked when the run loads it.
SCAN_BUDGET_TOKENS = 1 << 26


def _ids_leaf(meta) -> int | None:
    """Index of the `input_ids` list's element column in a Parquet file's metadata."""
    for i in range(meta.num_columns):
        if meta.schema.column(i).path.split(".")[0] == "input_ids":
            return i
    return None


def _supervised_pairs(lm, max_seq_len: int | None) -> tuple[int, int | None]:
    """(anchor candidates within max_seq_len, the shortest --max-seq-len that leaves one) of a row
    group's loss_mask lists (data.anchor_candidates: a supervised token and a supervised next)."""
    import numpy as np
    import pyarrow.compute as pc

    m = pc.not_equal(pc.list_flatten(lm).cast("int64"), 0).to_numpy(zero_copy_only=False)
    row = pc.list_parent_indices(lm).to_numpy()
    pos = np.arange(len(m)) - lm.offsets.to_numpy()[row]
    pair = m[:-1] & m[1:] & (row[:-1] == row[1:])
    need = int(pos[:-1][pair].min()) + 2 if pair.any() else None
    kept = pair if max_seq_len is None else pair & (pos[:-1] <= max_seq_len - 2)
    return int(kept.sum()), need


def check_data_values(files, vocab: int, budget_tokens: int | None = None, max_seq_len: int | None = None) -> str:
    """Token ids in [0, vocab) and one loss_mask entry per token, before the target loads.
    Token range: the Parquet column statistics when every row group of a file has them, otherwise
    read. loss_mask lengths have no statistics: read, row group by row group, until
    budget_tokens were read (then the summary says how far it got). With every row read and every
    file masked, at least one supervised token pair must be left after truncation to max_seq_len
    (else every step trains zero rows). Raises ConfigError."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    budget = SCAN_BUDGET_TOKENS if budget_tokens is None else budget_tokens
    fix_ids = "tokenize with the target model's tokenizer (the data and --target-model do not belong together)"
    by_stats, read_rows, total_rows, read_tokens, cut = [], 0, 0, 0, False
    lo = hi = need = None
    pairs, all_masked = 0, True
    for f in files:
        pf = pq.ParquetFile(f)
        meta = pf.metadata
        total_rows += meta.num_rows
        leaf = _ids_leaf(meta)
        stats = [meta.row_group(g).column(leaf).statistics for g in range(meta.num_row_groups)]
        if all(st is not None and st.has_min_max for st in stats):
            by_stats.append(f)
            for g, st in enumerate(stats):
                if meta.row_group(g).num_rows and (st.min < 0 or st.max >= vocab):
                    bad = st.max if st.max >= vocab else st.min
                    raise ConfigError(f"{f}: token id {bad} outside the target's vocab of {vocab} (Parquet column "
                                      f"statistics of row group {g})", fix_ids)
                if meta.row_group(g).num_rows:
                    lo = st.min if lo is None else min(lo, st.min)
                    hi = st.max if hi is None else max(hi, st.max)
        has_mask = "loss_mask" in pf.schema_arrow.names
        all_masked = all_masked and has_mask
        if f in by_stats and not has_mask:
            continue  # nothing left to read in this file
        first = 0
        for g in range(meta.num_row_groups):
            if read_tokens >= budget:
                cut = True
                break
            t = pf.read_row_group(g, columns=["input_ids", "loss_mask"] if has_mask else ["input_ids"])
            ids = t.column("input_ids").combine_chunks()
            n_ids = pc.fill_null(pc.list_value_length(ids), 0)
            if has_mask:
                lm = t.column("loss_mask").combine_chunks()
                n_lm = pc.list_value_length(lm)
                wrong = pc.fill_null(pc.not_equal(n_ids, n_lm), True)
                if pc.any(wrong).as_py():
                    r = pc.index(wrong, True).as_py()
                    got = n_lm[r].as_py()
                    raise ConfigError(f"{f} row {first + r}: loss_mask has {'no value' if got is None else got} "
                                      f"entries, input_ids {n_ids[r].as_py()}", "write one loss_mask entry per token")
                kept, first_need = _supervised_pairs(lm, max_seq_len)
                pairs += kept
                need = min((x for x in (need, first_need) if x is not None), default=None)
            if f not in by_stats:
                flat = pc.list_flatten(ids)
                if len(flat):
                    out_of_range = pc.or_(pc.less(flat, 0), pc.greater_equal(flat, vocab))
                    if pc.any(out_of_range).as_py():
                        k = pc.index(out_of_range, True).as_py()
                        row = pc.list_parent_indices(ids)[k].as_py()
                        raise ConfigError(f"{f} row {first + row}: token id {flat[k].as_py()} outside the target's "
                                          f"vocab of {vocab} (read)", fix_ids)
                    mm = pc.min_max(flat)
                    lo = mm["min"].as_py() if lo is None else min(lo, mm["min"].as_py())
                    hi = mm["max"].as_py() if hi is None else max(hi, mm["max"].as_py())
            read_tokens += pc.sum(n_ids).as_py() or 0
            read_rows += t.num_rows
            first += t.num_rows
    if max_seq_len is not None and all_masked and not cut and not pairs:
        raise ConfigError(f"--max-seq-len {max_seq_len}: no supervised token pair is left in the data after truncation "
                          "(every step would train zero rows, loss nan)",
                          f"raise --max-seq-len to at least {need} (the shortest that keeps a supervised pair)"
                          if need else "supervise the completions: loss_mask 1 on their tokens")
    src = ("Parquet column statistics" if len(by_stats) == len(files) else
           "read from the data" if not by_stats else f"Parquet column statistics of {len(by_stats)} of "
           f"{len(files)} file(s), the others read")
    how = f"token ids {lo}..{hi} < vocab {vocab} ({src})" if lo is not None else "no token ids"
    if cut:
        return how + (f"; bounded scan of loss_mask lengths and ids: {read_rows} of {total_rows} rows read "
                      f"({read_tokens} tokens, budget {budget}), the rest is checked when the run loads the data")
    return how + (f"; full scan of loss_mask lengths: all {read_rows} rows" if read_rows else "; no loss_mask column")


def check_devices(cfg, target_devices, drafter_devices) -> None:
    """Target and drafter devices against each other: what the trainer can run. A GPU may hold both
    a target and a drafter only in the in-process layout (one node, one target and one drafter on
    that one device, called in-line). Any other overlap would put a target worker and a drafter
    rank on one GPU as two processes with a CUDA context and a share of memory each, which the
    topology does not do: refused; --drafter-serves-target is the way to have a drafter's GPU run
    the target too. That flag in the in-process layout would be a second replica on the one device:
    refused as well."""
    if cfg.nnodes > 1 and "cpu" in drafter_devices and "cpu" not in target_devices:
        raise ConfigError("--drafter-gpus cpu with GPU targets", "put targets and drafters on the same kind of device")
    shared = [d.split(":")[1] for d in drafter_devices if d != "cpu" and d in target_devices]
    in_process = in_process_layout(cfg.nnodes, target_devices, drafter_devices)
    if shared and not in_process:
        raise ConfigError(f"--drafter-gpus {cfg.drafter_gpus} overlaps --target-gpus {cfg.target_gpus} on GPU(s) "
                          f"{','.join(shared)}: only one target and one drafter on one node may share a GPU "
                          "(in one process)", "give the drafter ranks GPUs of their own (e.g. --target-gpus 0,1,2,3,4,5,6 "
                          "--drafter-gpus 7, and --drafter-serves-target for the drafter's GPU to run the target "
                          "while it would wait), or one GPU for both on one node")
    if in_process and cfg.drafter_serves_target:
        raise ConfigError("--drafter-serves-target with one device for target and drafter: the drafter already "
                          "runs the target on that device, in its own process",
                          "drop --drafter-serves-target, or give the targets devices of their own")


def memory_need(target_params, drafter_params, replica_devices, drafter_devices) -> dict[str, float]:
    """Bytes of weights and optimizer state per device: a target replica in its compute dtype (fp32 on
    the CPU, bf16 on a GPU, 10% over) on each of `replica_devices` (the target devices, and the
    drafter devices with --drafter-serves-target), and the drafter's fp32 parameters, gradients and
    AdamW moments (16 bytes a parameter) on each drafter device. Activations are not counted."""
    need = {}
    for d in replica_devices:
        need[d] = need.get(d, 0) + target_params * (4 if d == "cpu" else 2) * 1.1
    for d in drafter_devices:
        need[d] = need.get(d, 0) + drafter_params * 16
    return need


def preflight_teacher_fp8(cfg, vocab: int, hidden: int, drafter_devices) -> str | None:
    """--teacher-fp8's needs, before anything is loaded: its summary line, or None when it is off."""
    if not cfg.teacher_fp8:
        return None
    if not cfg.use_soft_labels or cfg.kl_weight == 0:
        why = "with --no-use-soft-labels" if not cfg.use_soft_labels else "with --kl-weight 0"
        raise ConfigError(f"--teacher-fp8 {why}: a CE-only run computes no teacher logits",
                          "train with soft labels (the default) and a --kl-weight above 0, or drop --teacher-fp8")
    if cfg.loss_impl == "torch" or "cpu" in drafter_devices:
        what = "--loss-impl torch" if cfg.loss_impl == "torch" else "a CPU drafter"
        raise ConfigError(f"--teacher-fp8 with {what}: the FP8 teacher GEMM is an option of the Triton kernel on CUDA",
                          "train the drafter on a GPU with --loss-impl auto or triton, or drop --teacher-fp8")
    try:
        from flashfleet_kernels.distill_loss import fp8_head_problem, fp8_head_rows
    except ImportError as e:
        raise ConfigError(f"--teacher-fp8 but the fused loss is not importable ({e})",
                          "install the venv from its lock (triton is pinned there), or drop --teacher-fp8") from e
    for d in dict.fromkeys(drafter_devices):
        problem = fp8_head_problem(vocab, hidden, torch.device(d), torch.bfloat16)
        if problem:
            raise ConfigError(f"--teacher-fp8 cannot run on {d} with torch {torch.__version__}: {problem}",
                              "drop --teacher-fp8 (where the GPU is the problem: train on GPUs with row-wise "
                              "scaled FP8 GEMMs, H100/H200 class)")
    return (f"loss: teacher logits in FP8 (row-wise scales); the head's FP8 copy takes "
            f"{fp8_head_rows(vocab) * hidden / 2**30:.2f} GiB more on each drafter GPU")


def check_wandb_credentials(project, settings: dict) -> str:
    """wandb.init with a project needs credentials unless wandb is offline or disabled; without
    them it fails after the target loaded (a UsageError) and leaves a half-written run directory."""
    if not project:
        return ""
    mode = str(settings.get("mode") or os.environ.get("WANDB_MODE") or "").lower()
    if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        mode = "disabled"
    if mode in ("offline", "disabled", "dryrun"):
        return f"wandb mode {mode}: no credentials needed"
    if os.environ.get("WANDB_API_KEY"):
        return "wandb credentials: $WANDB_API_KEY"
    token = os.environ.get("WANDB_IDENTITY_TOKEN_FILE")
    if token and os.path.isfile(token):
        return f"wandb credentials: identity token {token}"
    base = settings.get("base_url") or os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    host = urlparse(str(base)).hostname or str(base)
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        auth = None
    if auth and auth[2]:
        return f"wandb credentials: {path} entry for {host}"
    raise ConfigError(f"--wandb-project {project}: no wandb credentials (no $WANDB_API_KEY, no {host} entry in {path}) "
                      "and wandb is not offline: wandb.init would fail after the target loaded",
                      "set WANDB_API_KEY (or run `wandb login` as the run's user), or WANDB_MODE=offline")


def check_checkpoints(cfg, dcfg: DrafterConfig, world: int) -> tuple[list[str], ckpt.Found | None]:
    """What the run will resume from, checked now: an explicit --resume path must verify in full;
    with auto, the newest complete checkpoint (sizes, sha256, header, marker), and step
    directories newer than it are named (a start moves them aside). The chosen checkpoint's
    drafter and micro-batches per optimizer step must be this run's. (Summary lines, what was
    verified: the one full verification of a start.)"""
    root = Path(cfg.output_dir) / CHECKPOINTS
    if cfg.resume == "never":
        n = len(ckpt.complete_checkpoints(root))
        return ["checkpoints: --resume never, starting from scratch" + (
            f" ({n} complete checkpoint(s) in {root} are not read; saving a step they hold replaces it)" if n else "")
        ], None
    lines = []
    if cfg.resume != "auto":
        path = Path(cfg.resume)
        problems = ckpt_contract.verify(path, check_hashes=True)
        if problems:
            raise ConfigError(f"--resume {path} is not a complete checkpoint ({problems[0]})",
                              "pass --resume auto (the newest complete one) or a complete checkpoints/step-XXXXXXXX")
        found = ckpt.Found(root=root, resume=cfg.resume, path=path)
    else:
        bad, path = ckpt.broken_newest(root)
        found = ckpt.Found(root=root, resume="auto", path=path, newer=bad)
        for c in bad:
            lines.append(f"WARNING checkpoint {c['path']} is not complete ({c['problems'][0]}): a start moves it aside "
                         f"to {ckpt_contract.quarantine_name(root, c['step'])} (kept, never deleted)")
        if path is None:
            return lines + [f"checkpoints: no complete checkpoint in {root}, starting from scratch"], found
    try:
        saved = json.loads((path / ckpt.CONFIG).read_text())
        theirs = DrafterConfig.from_dict(saved).to_dict()
        state = ckpt.load_state(path)
    except Exception as e:
        raise ConfigError(f"checkpoint {path}: config or trainer state unreadable ({str(e).splitlines()[0]})",
                          "pass --resume never or a new --output-dir, and keep the checkpoint for a look") from e
    mine = dcfg.to_dict()
    diff = ckpt.drafter_differences(mine, theirs)
    if diff:
        what = ", ".join(f"{k} {theirs.get(k)} there, {mine.get(k)} here" for k in diff)
        raise ConfigError(f"checkpoint {path} has a different drafter ({what})",
                          "use a new --output-dir, --resume never, or the drafter flags the checkpoint was trained with")
    saved_world, saved_accum = state.get("world"), (state.get("args") or {}).get("grad_accum")
    per_step = cfg.grad_accum * world
    if saved_world is not None and saved_accum is not None and saved_world * saved_accum != per_step:
        fit = saved_world * saved_accum / world
        hint = f"--grad-accum {int(fit)}" if fit == int(fit) and fit >= 1 else "the checkpoint's topology"
        raise ConfigError(f"checkpoint {path} was trained with {saved_world * saved_accum} micro-batches per optimizer "
                          f"step (--grad-accum {saved_accum} x {saved_world} drafter rank(s)), this run takes {per_step} "
                          f"(--grad-accum {cfg.grad_accum} x {world}): its step count, LR schedule and data position "
                          "would mean something else", f"pass {hint}, or use a new --output-dir or --resume never")
    lines.append(f"checkpoints: resumes from {path} (step {state.get('step')}; verified: sizes, sha256, header, "
                 f"marker; the same drafter; {per_step} micro-batches per step as saved)")
    return lines, found


def drafter_config(cfg, tcfg, layer_ids, mask_id) -> DrafterConfig:
    """The drafter this run builds: the target's defaults (`drafter.drafter_defaults`) and the flags."""
    dflash2 = {}
    if cfg.drafter_kind == "dflash2":  # what speculators, z-lab and vLLM refuse, refused here first
        dflash2 = {k: getattr(cfg, k) or DFLASH2[k] for k in DFLASH2_SHAPE}
        t = text_config_of(tcfg)
        problem = dflash2_problem(t.hidden_size, cfg.block_size, t.vocab_size, dflash2["conv_kernel_size"],
                                  dflash2["conv_group_size"], dflash2["selector_top_k"])
        if problem:
            raise ConfigError(*problem)
    try:
        dcfg = DrafterConfig.from_target(
            tcfg, num_draft_layers=cfg.num_draft_layers, target_layer_ids=layer_ids, block_size=cfg.block_size,
            mask_token_id=mask_id, target_model=cfg.target_model, layer_types=cfg.drafter_layer_types,
            sliding_window=cfg.sliding_window, num_attention_heads=cfg.drafter_num_heads,
            num_key_value_heads=cfg.drafter_num_kv_heads, head_dim=cfg.drafter_head_dim,
            intermediate_size=cfg.drafter_intermediate_size, drafter_kind=cfg.drafter_kind, **dflash2)
    except ValueError as e:
        raise ConfigError(f"--drafter-layer-types / --sliding-window: {e}",
                          "give one of full|sliding per draft layer, and --sliding-window W with sliding layers") from e
    if cfg.sliding_window is not None and "sliding_attention" not in dcfg.layer_types:
        raise ConfigError(f"--sliding-window {cfg.sliding_window} but no draft layer is sliding_attention "
                          f"({dcfg.layer_types})", "drop --sliding-window or pass --drafter-layer-types")
    if dcfg.num_attention_heads % dcfg.num_key_value_heads:
        raise ConfigError(f"drafter heads {dcfg.num_attention_heads} not a multiple of KV heads "
                          f"{dcfg.num_key_value_heads}", "pick --drafter-num-heads divisible by --drafter-num-kv-heads")
    return dcfg


def check_output_dir(output_dir) -> None:
    """The run can make (or use) its directory: no file there or above it, the nearest existing
    ancestor writable."""
    out = Path(output_dir)
    probe = out  # the nearest existing ancestor decides whether the run can create its directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--output-dir {out}: {probe} is a file, not a directory",
                          "pass a directory path for the run (a new one, or the run's own)")
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"--output-dir {out} is not writable", "create it or fix its ownership")


@dataclass
class Found:
    """What the checks found so far: each check reads what earlier ones set, and adds its own."""

    summary: list = field(default_factory=list)  # the lines `--check` prints
    model_dir: Path | None = None
    tcfg: object = None  # the target's transformers config
    text: object = None  # its text config (the config itself for a text-only model)
    weights: TargetWeights | None = None
    layer_ids: list = field(default_factory=list)
    mask_id: int = 0
    files: list = field(default_factory=list)
    rows: int = 0
    target_devices: list = field(default_factory=list)
    drafter_devices: list = field(default_factory=list)
    servers: list = field(default_factory=list)
    params: float = 0.0  # the target's parameters a replica loads
    world: int = 0  # drafter ranks in all
    dcfg: DrafterConfig | None = None
    checkpoints: ckpt.Found | None = None
    wandb_settings: dict = field(default_factory=dict)

    @property
    def replica(self) -> float:
        """Bytes of one target replica in bf16, 10% over."""
        return self.params * 2 * 1.1

    def start_facts(self) -> StartFacts:
        return StartFacts(target_config=self.tcfg, layer_ids=self.layer_ids, mask_token_id=self.mask_id,
                          target_devices=self.target_devices, drafter_devices=self.drafter_devices,
                          data_files=self.files, data_rows=self.rows, wandb_settings=self.wandb_settings,
                          summary=self.summary, drafter_config=self.dcfg, vocab_size=self.text.vocab_size,
                          checkpoints=self.checkpoints, servers=self.servers,
                          num_target_layers=self.text.num_hidden_layers)


# The checks, each `check(cfg, found) -> line(s) or None`, run in CHECKS' order: a check raises
# ConfigError (exit 78) or returns what `--check` prints. cfg is the parsed run configuration.

def output_dir(cfg, f: Found):
    """The run can make or use --output-dir (first: the checkpoint check reads under it)."""
    check_output_dir(cfg.output_dir)


def target_config(cfg, f: Found):
    """--target-model holds a loadable config.json of a supported, unquantized decoder."""
    from transformers import AutoConfig

    f.model_dir = model_dir = Path(cfg.target_model)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"--target-model {model_dir}: no config.json there (not a local model directory)",
                          "stage the model first and point --target-model at its directory")
    try:
        f.tcfg = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:
        raise ConfigError(f"--target-model {model_dir}: config.json not loadable ({str(e).splitlines()[0]})",
                          f"use a transformers model directory of a supported architecture ({supported_targets_line()})"
                          ) from e
    try:
        f.text = check_target_config(f.tcfg)
    except ValueError as e:
        raise ConfigError(str(e), "point --target-model at a Qwen3 or Qwen3.5/3.6/3.8 model directory") from e
    method = quantization_of(f.tcfg)
    # The target loads here unless vLLM serves it and nothing (evaluation, server check) loads it here too.
    if method and (not cfg.target_servers or cfg.eval_num_prompts or cfg.eval_interval or cfg.server_check_every):
        raise ConfigError(f"--target-model {model_dir} is a quantized checkpoint ({method}), which this run would "
                          "load as its frozen target here (the trainer has no quantizer for it)", QUANTIZED_FIX)
    for attr in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        if not getattr(f.text, attr, None):
            raise ConfigError(f"target model type {f.tcfg.model_type!r} has no {attr}",
                              "use a decoder-only LM (Qwen3 first)")


def target_weights(cfg, f: Found):
    """Weights are there, and the embedding and LM head have config.json's [vocab, hidden] shape."""
    model_dir, text = f.model_dir, f.text
    f.weights = weights = read_target_weights(model_dir)
    if weights is None and not _model_bytes(model_dir):
        raise ConfigError(f"--target-model {model_dir}: no *.safetensors or *.bin weights", "stage the weights too")
    if weights is not None:  # the tensors a replica loads (a wrapped checkpoint's language model only)
        f.params = weights.params
        embed_name, head_name = frozen_io_names(weights.shapes)
        tied = bool(getattr(text, "tie_word_embeddings", False))
        for role, name in (("embedding", embed_name), ("LM head", head_name if not tied else embed_name)):
            if name is None:
                raise ConfigError(f"--target-model {model_dir}: no {role} tensor in the checkpoint "
                                  f"({'embed_tokens.weight' if role == 'embedding' else 'lm_head.weight'})",
                                  "stage the complete model")
            if list(weights.shapes[name]) != [text.vocab_size, text.hidden_size]:
                raise ConfigError(f"--target-model {model_dir}: {name} is {weights.shapes[name]}, not "
                                  f"[{text.vocab_size}, {text.hidden_size}] as config.json says",
                                  "stage the model whose config.json this is")
    else:
        stored_per_param = 2 if "16" in str(getattr(text, "dtype", None) or getattr(text, "torch_dtype", "")) else 4
        f.params = _model_bytes(model_dir) / stored_per_param


def target_layers(cfg, f: Found):
    """--target-layers (or the default for the draft layers) are distinct decoder layers, in order."""
    n_layers = f.text.num_hidden_layers
    if cfg.target_layers:
        try:
            layer_ids = [int(x) for x in str(cfg.target_layers).split(",") if x.strip()]
        except ValueError as e:
            raise ConfigError(f"--target-layers {cfg.target_layers!r} is not a list of integers",
                              "e.g. 1,9,17,25,33") from e
    else:
        try:
            layer_ids = run_target_layers(f.text, cfg.num_draft_layers, cfg.drafter_kind)
        except ValueError as e:
            raise ConfigError(f"--num-draft-layers {cfg.num_draft_layers}: {e}",
                              "fewer --num-draft-layers, or --target-layers with distinct ascending ids") from e
    if not layer_ids or min(layer_ids) < 0 or max(layer_ids) >= n_layers:
        raise ConfigError(f"--target-layers {layer_ids} outside the target's decoder layers 0..{n_layers - 1}",
                          "use 0-based decoder-layer indices")
    problem = layer_ids_problem(layer_ids)
    if problem:
        raise ConfigError(f"--target-layers {cfg.target_layers}: {problem}",
                          f"--target-layers {','.join(map(str, sorted(set(layer_ids))))} (each layer once, in order)")
    f.layer_ids = layer_ids


def target_summary(cfg, f: Found):
    """The mask token is usable; the target, its features and its weights described."""
    text, tcfg, weights = f.text, f.tcfg, f.weights
    vocab = text.vocab_size
    f.mask_id = default_mask_token_id(vocab) if cfg.mask_token_id is None else cfg.mask_token_id
    mask_note = check_mask_token(f.model_dir, f.mask_id, vocab)
    kinds = getattr(text, "layer_types", None) or []
    stack = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds)) if kinds else "all full attention"
    lines = [f"target {f.model_dir} ({tcfg.model_type}" + (f", text {text.model_type}" if text is not tcfg else "")
             + f", {text.num_hidden_layers} layers: {stack}, hidden {text.hidden_size}, vocab {vocab}); features from "
             f"decoder layers {f.layer_ids} (output of layer i = HF hidden_states[i+1]); mask id {f.mask_id}: {mask_note}"]
    if weights is not None:
        layout = ("multimodal wrapper: language model model.language_model.* + lm_head.* loaded, "
                  f"{weights.skipped} other tensor(s) (vision tower, MTP) never read") if weights.wrapped else \
            "language model at the top level"
        size = f"{weights.params / 1e9:.2f}B" if weights.params >= 1e8 else f"{weights.params / 1e6:.2f}M"
        lines.append(f"weights: {size} params, {weights.nbytes / 2**30:.2f} GiB stored ({layout}); shard headers ok")
    return lines


def data(cfg, f: Found):
    """The data's schema, token ids and supervised pairs; --eval-prompts exists."""
    f.files, f.rows = check_schema(cfg.data_dir)
    line = (f"data {cfg.data_dir}: {len(f.files)} Parquet file(s), {f.rows} rows, schema ok; "
            + check_data_values(f.files, f.text.vocab_size, max_seq_len=cfg.max_seq_len))
    if cfg.eval_prompts and not Path(cfg.eval_prompts).is_file():
        raise ConfigError(f"--eval-prompts {cfg.eval_prompts}: no such file (evaluation would be skipped silently)",
                          "point it at a JSONL of {\"input_ids\": [...]} or drop it")
    return line


def devices(cfg, f: Found):
    """Target and drafter devices (or vLLM servers, each asked once) exist and fit together."""
    f.drafter_devices = parse_devices(cfg.drafter_gpus, "--drafter-gpus")
    if cfg.target_servers:  # the target runs in vLLM: no target workers, no replica in this trainer
        f.servers = check_target_servers(cfg, f.layer_ids, f.text.num_hidden_layers, f.text.vocab_size,
                                         f.text.hidden_size, f.summary)
        if cfg.server_check_every:
            parse_devices(cfg.server_check_device, "--server-check-device")
            f.summary.append(f"server check: every {cfg.server_check_every} micro-batch(es) one sequence against "
                             f"the target loaded on {cfg.server_check_device} (tol {cfg.server_check_tol:g})")
    else:
        if cfg.server_check_every:
            raise ConfigError(f"--server-check-every {cfg.server_check_every} without --target-servers: there is "
                              "no server to check", "drop --server-check-every, or pass --target-servers")
        f.target_devices = parse_devices(cfg.target_gpus, "--target-gpus")
    check_devices(cfg, f.target_devices, f.drafter_devices)
    cuda = [d for d in f.target_devices + f.drafter_devices if d != "cpu"]
    if cuda:
        have = torch.cuda.device_count()
        top = max(int(d.split(":")[1]) for d in cuda)
        if top >= have:
            raise ConfigError(f"GPU {top} requested (--target-gpus {cfg.target_gpus} --drafter-gpus "
                              f"{cfg.drafter_gpus}) but {have} CUDA device(s) are visible",
                              "request only visible GPUs, or `cpu` for both")


def topology(cfg, f: Found):
    """Who runs where: target workers or servers, drafter ranks, nodes, and NCCL's transport."""
    f.world = cfg.nnodes * len(f.drafter_devices)
    targets = (f"{len(f.servers)} vLLM target server(s) of --server-gpus {cfg.server_gpus} GPU(s) each (the target's "
               f"weights ~{f.replica / cfg.server_gpus / 2**30:.2f} GiB in bf16 per server GPU, before vLLM's KV cache)"
               if f.servers else
               f"{len(f.target_devices)} target worker(s) on {','.join(f.target_devices)}")
    return [f"topology: {targets}; {len(f.drafter_devices)} drafter rank(s) on {','.join(f.drafter_devices)} per "
            f"node; {cfg.nnodes} node(s), {f.world} drafter rank(s) in all; {cfg.grad_accum * f.world} micro-batches "
            "per optimizer step", nccl_transport(cfg.nnodes, f.drafter_devices)]


def linear_attention(cfg, f: Found):
    """A hybrid target's linear-attention layers have their fast kernels (or the slow path is allowed)."""
    if f.servers or cfg.target_servers:
        return None
    return check_linear_attention(f.text, f.target_devices, cfg.allow_slow_linear_attention) or None


def drafter(cfg, f: Found):
    """The drafter this run builds is consistent (layer types, window, heads, DFlash 2's shape)."""
    f.dcfg = dcfg = drafter_config(cfg, f.tcfg, f.layer_ids, f.mask_id)
    kinds = ", ".join(f"{dcfg.layer_types.count(k)} {k}" for k in dict.fromkeys(dcfg.layer_types))
    return (f"drafter: {dcfg.num_hidden_layers} layers ({kinds}" + (f", window {dcfg.sliding_window}"
            if dcfg.sliding_window else "") + (", non-causal in the block" if dcfg.sliding_window_non_causal else "")
            + f"), hidden {dcfg.hidden_size}, {dcfg.num_attention_heads}/"
            f"{dcfg.num_key_value_heads} heads of {dcfg.head_dim}, MLP {dcfg.intermediate_size}, block "
            f"{dcfg.block_size}, rope theta {dcfg.rope_theta:g}" + (
                f"; dflash2: {dcfg.conv_kernel_size} conv taps, conv group {dcfg.conv_group_size}, selector rank "
                f"{dcfg.selector_rank}, top-{dcfg.selector_top_k}" if dcfg.drafter_kind == "dflash2" else ""))


def init_from(cfg, f: Found):
    """--init-from holds this run's drafter (config and tensor shapes)."""
    if not cfg.init_from:
        return None
    from .export import check_init_from

    check_init_from(cfg.init_from, f.dcfg)
    return f"init from {cfg.init_from}: the same drafter (config and tensor shapes match)"


def checkpoints(cfg, f: Found):
    """What the run resumes from, verified in full (check_checkpoints)."""
    lines, f.checkpoints = check_checkpoints(cfg, f.dcfg, f.world)
    return lines


def memory(cfg, f: Found):
    """Target replicas, the drafter and its optimizer state fit each device (activations not counted)."""
    drafter_params = f.dcfg.num_params()
    # With --drafter-serves-target every drafter device holds a replica too.
    replica_devices = f.target_devices + (f.drafter_devices if cfg.drafter_serves_target else [])
    for d in dict.fromkeys(d for d in replica_devices if d != "cpu"):
        total = torch.cuda.get_device_properties(int(d.split(":")[1])).total_memory
        if f.replica > total:
            raise ConfigError(f"one target replica needs about {f.replica / 2**30:.1f} GiB in bf16 but {d} has "
                              f"{total / 2**30:.1f} GiB in all: a target that does not fit one GPU runs in "
                              "vLLM, with its tensor parallelism",
                              "serve the target with vLLM and pass --target-servers (docs/trainer.md, \"The target "
                              "in vLLM\"), or use GPUs with more memory")
    for d, b in memory_need(f.params, drafter_params, replica_devices, f.drafter_devices).items():
        free = _mem_available_bytes() if d == "cpu" else torch.cuda.mem_get_info(int(d.split(":")[1]))[0]
        if b > free:
            serving = " or drop --drafter-serves-target" if cfg.drafter_serves_target and d in f.drafter_devices else ""
            raise ConfigError(f"{d} needs about {b / 2**30:.1f} GiB for weights and optimizer state but "
                              f"{free / 2**30:.1f} GiB is free", f"use more/larger GPUs or fewer draft layers{serving}")
    return (f"memory estimate: target {f.params / 1e6:.1f}M params, drafter ~{drafter_params / 1e6:.1f}M "
            "trainable; fits free memory (activations not counted)")


def evaluation_memory(cfg, f: Found):
    """With vLLM servers, an evaluation borrows a whole replica beside the drafter: it must fit."""
    evals = [f"--eval-num-prompts {cfg.eval_num_prompts}"] if cfg.eval_num_prompts > 0 else []
    evals += [f"--eval-interval {cfg.eval_interval}"] if cfg.eval_interval > 0 else []
    if not (cfg.target_servers and evals):
        return None
    for d in dict.fromkeys(d for d in f.drafter_devices if d != "cpu"):
        total = torch.cuda.get_device_properties(int(d.split(":")[1])).total_memory
        if f.replica + f.dcfg.num_params() * 16 > total:
            raise ConfigError(f"{' and '.join(evals)} with --target-servers: the evaluations "
                              f"would load the whole target (~{f.replica / 2**30:.1f} GiB in bf16) beside "
                              f"the drafter on {d} ({total / 2**30:.1f} GiB)",
                              "pass --eval-num-prompts 0 --eval-interval 0 and measure tau by serving the "
                              "export with vLLM (docs/export.md)")


def wandb(cfg, f: Found):
    """wandb's settings parse and its credentials are there (unless offline or disabled)."""
    f.wandb_settings = wandb_compat.parse_settings(cfg.wandb_settings)
    lines = [wandb_compat.check(cfg.wandb_project, cfg.wandb_run_name, f.wandb_settings)]
    creds = check_wandb_credentials(cfg.wandb_project, f.wandb_settings)
    return lines + ([creds] if creds else [])


def loss(cfg, f: Found):
    """The loss implementation exists where the drafter runs (and --teacher-fp8's needs)."""
    try:
        get_loss_fn(cfg.loss_impl)
    except ImportError as e:
        raise ConfigError(f"--loss-impl triton but Triton is not importable ({e})",
                          "install the venv from its lock (triton is pinned there) or use --loss-impl auto") from e
    if cfg.loss_impl == "triton" and "cpu" in f.drafter_devices:
        raise ConfigError("--loss-impl triton on a CPU drafter: the Triton kernel runs on CUDA only",
                          "use --loss-impl auto (the kernel on CUDA, its torch reference on CPU) or torch")
    return preflight_teacher_fp8(cfg, f.text.vocab_size, f.text.hidden_size, f.drafter_devices)


def attention(cfg, f: Found):
    """--attn-impl runs on the drafter's device."""
    attn = cfg.attn_impl
    if attn == "flex" and "cpu" in f.drafter_devices:
        raise ConfigError("--attn-impl flex on a CPU drafter: torch's flex_attention has no backward on CPU",
                          "use --attn-impl auto or dense with --drafter-gpus cpu")
    if attn == "flex" and not flex_available():
        raise ConfigError(f"--attn-impl flex but torch {torch.__version__} has no flex_attention",
                          "use --attn-impl auto or dense, or a torch with torch.nn.attention.flex_attention")
    return f"drafter attention: {resolve_attn_impl(attn, f.drafter_devices[0])} (--attn-impl {attn})"


# In order: each may read what the ones before it found. docs/trainer.md lists them (a test checks).
CHECKS = (output_dir, target_config, target_weights, target_layers, target_summary, data, devices, topology,
          linear_attention, drafter, init_from, checkpoints, memory, evaluation_memory, wandb, loss, attention)


def preflight(cfg) -> StartFacts:
    """Run CHECKS in order on the parsed configuration. Raises ConfigError at the first refusal."""
    f = Found()
    for check in CHECKS:
        out = check(cfg, f)
        f.summary += [out] if isinstance(out, str) else list(out or [])
    return f.start_facts()
