"""The frozen target: which targets are supported, loading one (its language model only), and the
hidden-state producer that runs it for the drafter's features.

Feature convention (one, named, tested): a target layer id i means the OUTPUT of decoder layer
i (0-based), which is Hugging Face's `hidden_states[i + 1]` (index 0 there is the embedding
output). This is z-lab's convention. It is captured with forward hooks on the chosen decoder
layers, so no other layer's activations are kept.

The split between producer (target side) and drafter (consumer) is the seam for multi-process
topologies: `HiddenStateProducer` runs in the drafter's process for the single-device case
(feed.InProcessFeed) and inside each target worker process otherwise (topology.py, answering a
rank's feed.QueueFeed); drafter ranks that hold no target
read the frozen embedding and LM head straight from the safetensors (`load_frozen_io`).

Targets (`SUPPORTED_TARGETS`): Qwen3 (`qwen3`), and the hybrid Qwen3.5 / Qwen3.6 family
(`qwen3_5`, MoE `qwen3_5_moe`), whose checkpoints are multimodal wrappers: a config with a
nested `text_config`, language weights under `model.language_model.*`, `lm_head.weight`, and a
vision tower under `model.visual.*`. Any composite config is read through its text_config. For
a wrapped checkpoint only the language model is built (transformers' text CausalLM class from
the text config) and only `model.language_model.*` + `lm_head.*` tensors are read, from the
shards that hold them (`load_target_model`): the vision tower's shards are never opened.
"""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn
from flashfleet.plan.settings import RunConfig

from . import short_conv
from .compilation import cache_kwarg, compile_decoder_layers, compile_note, compiled_by_default
from .defaults import DFLASH2_TARGET_LAYERS


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """num_draft_layers ids spread evenly from 1 to L-3 (Qwen3 36 layers, 5 -> [1, 9, 17, 25, 33]),
    distinct and ascending always (LAYER_RULE): where 1..L-3 has too few layers the range reaches
    up to L-1 (4 layers, 2 draft layers -> [1, 2]); a target with fewer than that is refused."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    end = min(num_target_layers - 1, max(end, start + num_draft_layers - 1))
    if end - start + 1 < num_draft_layers:
        raise ValueError(f"a target of {num_target_layers} decoder layers is too shallow for {num_draft_layers} "
                         f"draft layers: the default needs {num_draft_layers} distinct layers among 1..{end} "
                         f"({LAYER_RULE})")
    step = (end - start) / (num_draft_layers - 1)  # >= 1, so the rounded ids stay distinct
    return [int(round(start + i * step)) for i in range(num_draft_layers)]


def run_target_layers(text_cfg, num_draft_layers: int, drafter_kind: str = "dflash") -> list[int]:
    """A run's target layers unless --target-layers gives them: for a DFlash 2 drafter of a hybrid
    Qwen3.5/3.6/3.8 target the published DFlash 2 ids where its depth and draft layers are the
    published pair (defaults.DFLASH2_TARGET_LAYERS: 64 and 5 -> [5, 19, 33, 47, 61]); else
    `default_target_layers` (DFlash's rule)."""
    n_layers = text_cfg.num_hidden_layers
    if drafter_kind == "dflash2" and getattr(text_cfg, "model_type", None) in HYBRID_TEXT_TYPES:
        published = DFLASH2_TARGET_LAYERS.get((n_layers, num_draft_layers))
        if published:
            return list(published)
    return default_target_layers(n_layers, num_draft_layers)


# vLLM gathers a DFlash drafter's target layers as tuple(sorted(set(ids))) (its models/interfaces.py):
# a repeated id gives the drafter fewer features than it was trained on (refused at the first
# request), ids out of order give it the right ones in the wrong order (served, silently worse).
LAYER_RULE = "vLLM serves a drafter with its target layers as sorted distinct ids, so they must be strictly ascending"


def layer_ids_problem(ids) -> str | None:
    """Why these target layer ids cannot be served by vLLM (LAYER_RULE), or None."""
    ids = list(ids)
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        return f"target layer ids {ids} are not strictly ascending: {LAYER_RULE}"
    return None


def rope_theta_of(cfg) -> float:
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", 1_000_000.0) or 1_000_000.0))


SUPPORTED_TARGETS = ("qwen3", "qwen3_5", "qwen3_5_moe")  # config.json model_type
SUPPORTED_TEXT_TYPES = ("qwen3", "qwen3_5_text", "qwen3_5_moe_text")  # a composite config's text_config
HYBRID_MODELING = {  # hybrid text model_type (Gated-DeltaNet + gated full attention) -> transformers' module
    "qwen3_5_text": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe_text": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
}
HYBRID_TEXT_TYPES = tuple(HYBRID_MODELING)
WRAPPED_PREFIX = "model.language_model."  # where a multimodal wrapper keeps the language model
TEXT_PREFIXES = (WRAPPED_PREFIX, "lm_head.")  # the only tensors read from a wrapped checkpoint


def text_config_of(cfg):
    """The language model's config: a composite config's text_config, else the config itself."""
    sub = getattr(cfg, "text_config", None)
    return cfg if sub is None else sub


def supported_targets_line() -> str:
    return (f"supported: {', '.join(SUPPORTED_TARGETS)}, and any composite config whose text_config is "
            f"{', '.join(SUPPORTED_TEXT_TYPES)}")


def check_target_config(cfg):
    """The text config of a supported target; ValueError naming the supported list otherwise."""
    text = text_config_of(cfg)
    top, kind = getattr(cfg, "model_type", None), getattr(text, "model_type", None)
    if kind not in SUPPORTED_TEXT_TYPES:
        what = repr(top) if text is cfg else f"{top!r} (text_config {kind!r})"
        raise ValueError(f"target model type {what} is not supported ({supported_targets_line()})")
    return text


# A quantized checkpoint (config.json's quantization_config, e.g. Qwen's -FP8 releases) is not a
# frozen replica this trainer can build: the lock has no quantizer backend for it (transformers' FP8
# one needs accelerate), and the wrapped path, which builds the text model from text_config alone,
# would load the FP8 weights without their scales: a wrong target, silently.
QUANTIZED_FIX = ("point --target-model at the bf16 checkpoint (Qwen/Qwen3.8-27B, not Qwen/Qwen3.8-27B-FP8), or "
                 "serve this one in vLLM (--target-servers) with --eval-num-prompts 0 --eval-interval 0 "
                 "--server-check-every 0, which load the target here")


def quantization_of(cfg) -> str | None:
    """The quantization method of a target's config.json (top level, or its text_config), else None."""
    for c in (cfg, text_config_of(cfg)):
        q = getattr(c, "quantization_config", None)
        if q:
            return str((q if isinstance(q, dict) else vars(q)).get("quant_method") or "unnamed")
    return None


def is_hybrid(text_cfg) -> bool:
    return "linear_attention" in (getattr(text_cfg, "layer_types", None) or [])


def checkpoint_tensors(model_dir) -> dict:
    """{tensor name: shard file name} of a safetensors checkpoint, from its index, else from each
    file's header (never the data). {} for a checkpoint without safetensors."""
    from flashfleet.contract.safetensors import INDEX, read_header

    d = Path(model_dir)
    if (d / INDEX).is_file():
        return dict(json.loads((d / INDEX).read_text())["weight_map"])
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        tensors, _problems = read_header(f)
        out.update(dict.fromkeys(tensors, f.name))
    return out


def is_wrapped(names) -> bool:
    """A multimodal wrapper's layout: the language model under model.language_model.*"""
    return any(n.startswith(WRAPPED_PREFIX) for n in names)


def text_tensor_files(names: dict) -> dict:
    """{shard: [tensor names]} of the language model's tensors (model.language_model.*, lm_head.*)
    of a wrapped checkpoint: the vision tower (model.visual.*) and MTP (mtp.*) are left out."""
    files = {}
    for name, f in names.items():
        if name.startswith(TEXT_PREFIXES):
            files.setdefault(f, []).append(name)
    return files


def load_target_model(model_dir, device, dtype):
    """The frozen target's language model as transformers' CausalLM (a `get_decoder()` with
    `.layers`, its final norm, an LM head), in eval mode without gradients, on `device`.

    A plain checkpoint loads with `AutoModelForCausalLM.from_pretrained`. A wrapped one (weights
    under model.language_model.*) builds the text CausalLM class from the text config and hands
    transformers a state dict of lazy safetensors slices of ONLY the language tensors, from only
    the shards that hold them, so the vision tower is never opened, read or allocated;
    transformers' own key conversion for the text class maps the names (model.language_model.X ->
    model.X; per-expert MoE tensors -> its fused experts). A missing language tensor is an error.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from .errors import ConfigError

    d = Path(model_dir)
    dev = torch.device(device)
    cfg = AutoConfig.from_pretrained(d, local_files_only=True)
    method = quantization_of(cfg)
    if method:  # refused before a shard is opened (QUANTIZED_FIX says why)
        raise ConfigError(f"target {d} is a quantized checkpoint ({method}): the trainer loads the target in "
                          "bf16/fp32 and has no quantizer for it", QUANTIZED_FIX)
    names = checkpoint_tensors(d)
    if not is_wrapped(names):
        model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=dtype, attn_implementation="sdpa")
        return fast_kernels(model.to(dev).eval().requires_grad_(False))
    from safetensors import safe_open
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    text = check_target_config(cfg)
    cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(text)]
    handles, state = [], {}
    try:
        for f, keys in sorted(text_tensor_files(names).items()):
            h = safe_open(os.fspath(d / f), framework="pt", device="cpu")
            handles.append(h)
            for k in keys:
                state[k] = h.get_slice(k)  # lazy: materialized by transformers onto the device
        kw = {"device_map": {"": str(dev)}} if dev.type == "cuda" else {}
        model, info = cls.from_pretrained(None, config=text, state_dict=state, dtype=dtype,
                                          attn_implementation="sdpa", output_loading_info=True, **kw)
    finally:
        for h in handles:
            h.__exit__(None, None, None)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise RuntimeError(f"{d}: the language model lacks {len(missing)} tensor(s) in the checkpoint, "
                           f"e.g. {missing[:3]}")
    return fast_kernels(model.to(dev).eval().requires_grad_(False))


def fast_kernels(model):
    """A CUDA hybrid target's short convolution through flash-linear-attention's kernel
    (`short_conv.bind`, where transformers fell back to torch); the model itself is unchanged."""
    if model.device.type == "cuda" and is_hybrid(text_config_of(model.config)):
        short_conv.bind(torch_conv_modules())
    return model


def torch_conv_modules() -> list[str]:
    """The hybrid modeling modules whose short convolution transformers left on its torch path."""
    return [name for kind, name in HYBRID_MODELING.items()
            if linear_attention_kernels(SimpleNamespace(model_type=kind))["causal_conv1d_fn"] == "torch"]


def linear_attention_kernels(text_cfg=None) -> dict:
    """What transformers' hybrid modeling module has bound for each linear-attention kernel:
    {kernel: implementation module, or "torch" for its reference fallback}. transformers picks
    flash-linear-attention (`fla`) for the gated delta rule and `causal_conv1d` for the short
    convolution when they import, else plain torch; `short_conv.bind` may since have put fla's
    convolution kernel in torch's place."""
    import importlib
    import inspect

    kind = getattr(text_cfg, "model_type", "qwen3_5_text") if text_cfg is not None else "qwen3_5_text"
    mod = importlib.import_module(HYBRID_MODELING["qwen3_5_moe_text" if "moe" in kind else "qwen3_5_text"])
    out = {}
    for kernel, attr in (("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
                         ("causal_conv1d_fn", "causal_conv1d_fn")):
        fn = getattr(mod, attr, None)
        impl = getattr(fn, short_conv.BOUND, None)  # flashfleet's binding (short_conv.bind)
        while fn is not None and impl is None:
            try:
                cv = inspect.getclosurevars(fn).nonlocals
            except (TypeError, ValueError):
                cv = {}
            if "is_new_implementation" in cv:
                impl = getattr(cv.get("implementation"), "__module__", "?") if cv["is_new_implementation"] else "torch"
            fn = getattr(fn, "__wrapped__", None)
        if impl is None:  # another transformers layout: probe the packages it would import
            pkg = "fla.ops.gated_delta_rule" if kernel == "chunk_gated_delta_rule" else "causal_conv1d"
            try:
                impl = getattr(importlib.import_module(pkg), kernel).__module__
            except Exception:
                impl = "torch"
        out[kernel] = impl
    return out


PADDING_SLACK = 0.1  # a target forward group may hold up to 10% padding (fewer, larger forwards)


def length_groups(lengths: list[int], slack: float = PADDING_SLACK) -> list[list[int]]:
    """Sequence indices grouped for the target: longest first, a group grows while its padded
    tokens (size x its longest) stay within (1 + slack) x its real tokens. All lengths equal: one
    group. Deterministic (ties keep index order)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, real = [], 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= (1 + slack) * (real + lengths[i]):
            groups[-1].append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return groups


class HiddenStateProducer:
    """The frozen target, one replica per target device; produces features for micro-batches.

    The target is its language model only (`load_target_model`: a wrapped Qwen3.5/3.6 checkpoint's
    vision tower is never loaded). Features: forward hooks on the chosen decoder layers, whatever
    their kind (a hybrid stack's Gated-DeltaNet and full-attention layers alike): id i is the
    output of decoder layer i, HF's hidden_states[i + 1] for i < L - 1 (HF's last entry,
    hidden_states[L], is the final-normed state instead). The teacher's last hidden state is the
    decoder's output after its final norm; logits = that @ the untied (or tied) LM head."""

    def __init__(self, model_dir, devices, layer_ids, out_device, on_status=None, replicas=None, compile_layers=False):
        """replicas: [(device, model)] already built (a benchmark's random-weight target) instead
        of loading model_dir on each device. compile_layers: `compile_decoder_layers` on each replica
        where `compiled_by_default` says so (the training feeds ask for it; evaluation, whose
        forwards carry a KV cache, does not)."""
        self.layer_ids, self.out_device, self.replicas, self._next = list(layer_ids), out_device, [], 0
        for i, dev in enumerate([] if replicas is not None else devices):
            if on_status:
                on_status(f"loading target {i + 1}/{len(devices)} on {dev}")
            dtype = torch.float32 if dev == "cpu" else torch.bfloat16
            model = load_target_model(model_dir, dev, dtype)
            self.replicas.append((dev, model))
            if on_status:
                on_status(f"target {i + 1}/{len(devices)} loaded")
        self.replicas = self.replicas or list(replicas)
        self.compiled_layers = 0  # per replica; 0 when eager
        for i, (dev, model) in enumerate(self.replicas):
            if compile_layers and compiled_by_default(dev):
                self.compiled_layers = compile_decoder_layers(model)
                if on_status:
                    on_status(f"target {i + 1}/{len(self.replicas)}: {compile_note(self.compiled_layers)}")
        model = self.replicas[0][1]
        self.config = model.config
        self.cache_kw = cache_kwarg(model.get_decoder())  # once: forward runs every draft-verify cycle
        # The drafter's frozen embedding and LM head, on the drafter's device, in its dtype.
        self.embed_weight = model.get_input_embeddings().weight.detach().to(out_device)
        self.lm_head_weight = model.get_output_embeddings().weight.detach().to(out_device)

    @classmethod
    def for_training(cls, cfg: RunConfig, devices, layer_ids, out_device, on_status=None):
        """A training feed's producer: the run's --target-model, its layers compiled unless
        --target-compile off."""
        return cls(cfg.paths.target_model, devices, layer_ids, out_device, on_status=on_status,
                   compile_layers=cfg.drafter.target_compile != "off")

    @torch.no_grad()
    def forward(self, input_ids, attention_mask=None, replica=None, past_key_values=None, want_last=True):
        """input_ids [S, T] -> (features [S, T, n*H], last normed hidden [S, T, H]) on out_device.
        past_key_values: a transformers cache to read and extend (the evaluator's; input_ids then
        continue the cached positions). want_last=False (a run without soft labels): the forward
        stops after the deepest feature layer, the layers above it and the final norm are never
        run, and last is None."""
        if replica is None:
            replica = self._next
            self._next = (self._next + 1) % len(self.replicas)
        dev, model = self.replicas[replica]
        decoder = model.get_decoder()
        captured, deepest = {}, max(self.layer_ids)

        def keep(i):
            def hook(_m, _inp, out):
                captured[i] = out[0] if isinstance(out, tuple) else out
                if i == deepest and not want_last:
                    raise _FeaturesDone
            return hook

        hooks = [decoder.layers[i].register_forward_hook(keep(i)) for i in sorted(set(self.layer_ids))]
        last = None
        try:
            out = decoder(input_ids=input_ids.to(dev),
                          attention_mask=None if attention_mask is None else attention_mask.to(dev),
                          use_cache=past_key_values is not None, **{self.cache_kw: past_key_values})
            last = out.last_hidden_state.to(self.out_device)
        except _FeaturesDone:
            pass
        finally:
            for h in hooks:
                h.remove()
        feats = torch.cat([captured[i] for i in self.layer_ids], dim=-1)
        return feats.to(self.out_device), last

    def forward_batch(self, ids, lengths, want_last=True, slack=PADDING_SLACK):
        """A right-padded micro-batch (ids [S, T], lengths [S]) -> (features, last) as forward()
        gives them at every valid position, zeros at the padding; but run as one forward per group
        of similar lengths (`length_groups`), so the target spends at most about `slack` of its work
        on padding instead of padding every sequence to the longest. No attention mask is passed:
        padding is on the right and every layer is causal (attention, the linear-attention
        recurrence and its short convolution alike), so a valid position never sees a padded one,
        and the forward takes the unmasked fast attention path; the padded positions' outputs are
        zeroed afterwards."""
        feats = last = None
        for group in length_groups(lengths.tolist(), slack):
            t = int(lengths[group].max())
            f, h = self.forward(ids[group, :t], want_last=want_last)
            if feats is None:
                feats = f.new_zeros(ids.shape[0], ids.shape[1], f.shape[-1])
                last = None if h is None else h.new_zeros(ids.shape[0], ids.shape[1], h.shape[-1])
            feats[group, :t] = f
            if last is not None:
                last[group, :t] = h
        pad = (torch.arange(ids.shape[1])[None] >= lengths[:, None]).to(feats.device)  # a group's shorter rows
        feats[pad] = 0
        if last is not None:
            last[pad] = 0
        return feats, last


class _FeaturesDone(Exception):
    """Raised by the deepest feature layer's hook to end a forward whose final state nobody reads."""


def frozen_io_names(names) -> tuple[str, str]:
    """(embedding, LM head) tensor names in a checkpoint: model.language_model.embed_tokens.weight
    in a wrapped one, else model.embed_tokens.weight (or any *embed_tokens.weight outside a
    vision tower or MTP head); lm_head.weight."""
    if WRAPPED_PREFIX + "embed_tokens.weight" in names:
        embed = WRAPPED_PREFIX + "embed_tokens.weight"
    elif "model.embed_tokens.weight" in names:
        embed = "model.embed_tokens.weight"
    else:
        embed = next((n for n in sorted(names) if n.endswith("embed_tokens.weight")
                      and not n.startswith(("model.visual.", "mtp."))), None)
    return embed, ("lm_head.weight" if "lm_head.weight" in names else None)


def load_frozen_io(model_dir, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding weight, LM head weight) of the target, read from its safetensors shards only.

    A drafter rank in its own process needs these two matrices but not the target's layers, so it
    reads just them (mmap'd by safetensors), from the shard(s) the index names for them, instead
    of loading a whole replica; a wrapped (multimodal) checkpoint keeps them at
    model.language_model.embed_tokens.weight and lm_head.weight. A tied head is the embedding.
    Falls back to loading the model on CPU for a .bin-only checkpoint.
    """
    from safetensors import safe_open

    d = Path(model_dir)
    names = checkpoint_tensors(d)
    embed_name, head_name = frozen_io_names(names)
    embed = head = None
    for name in (embed_name, head_name):
        if name is None:
            continue
        with safe_open(os.fspath(d / names[name]), framework="pt") as st:
            t = st.get_tensor(name)
        embed, head = (t, head) if name == embed_name else (embed, t)
    if embed is None:
        model = load_target_model(d, "cpu", dtype)
        embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    if head is None:  # tie_word_embeddings
        head = embed
    return embed.to(device=device, dtype=dtype), head.to(device=device, dtype=dtype)


def load_final_norm(model_dir, device, dtype) -> nn.Module:
    """The target's final norm alone, as its own transformers module (so a Qwen3.5/3.6 norm applies
    its weight the way that model does), with the weight read from the checkpoint's shard: what a
    trainer whose target runs elsewhere (vllm_target) needs to turn the last layer's output into
    the teacher's final state. The model is built on the meta device, so nothing else is allocated."""
    from safetensors import safe_open
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    d = Path(model_dir)
    text = check_target_config(AutoConfig.from_pretrained(d, local_files_only=True))
    with torch.device("meta"):
        norm = MODEL_FOR_CAUSAL_LM_MAPPING[type(text)](text).get_decoder().norm
    names = checkpoint_tensors(d)
    name = (WRAPPED_PREFIX if is_wrapped(names) else "model.") + "norm.weight"
    with safe_open(os.fspath(d / names[name]), framework="pt") as st:
        weight = st.get_tensor(name)
    norm = norm.to_empty(device=device).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm.eval().requires_grad_(False)
