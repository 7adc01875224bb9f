"""The target's hidden-state producer and the DFlash drafter.

Feature convention (one, named, tested): a target layer id i means the OUTPUT of decoder layer
i (0-based), which is Hugging Face's `hidden_states[i + 1]` (index 0 there is the embedding
output). This is z-lab's convention. It is captured with forward hooks on the chosen decoder
layers, so no other layer's activations are kept.

The split between producer (target side) and drafter (consumer) is the seam for multi-process
topologies: `HiddenStateProducer` runs in the drafter's process for the single-device case
(feed.InProcessFeed) and inside each target worker process otherwise (topology.py, answering a
rank's feed.QueueFeed); drafter ranks that hold no target
read the frozen embedding and LM head straight from the safetensors (`load_frozen_io`).

Drafter architecture (dflash.md): concat of the chosen layers' features -> bias-free Linear
(n*H -> H) -> RMSNorm gives one context feature shared by all draft layers. Each draft layer is
a Qwen3 decoder layer whose attention is NOT causal: Q from the block, K/V from
[context ; block] through the same k_proj/v_proj, QK-norm, RoPE at absolute positions. The
block is [anchor token, MASK x (B-1)] embedded with the target's frozen embedding; outputs go
through the target's frozen LM head. The drafter owns no embedding or head.

Attention has two implementations of the same mask (`attn_impl`): "dense", the reference, runs
SDPA with the boolean mask `[rows x (context + rows)]` that `block_attention_inputs` builds (CPU,
and every CUDA run that asks for it); "flex" runs torch's flex_attention, compiled, with a BlockMask
that lists only the 128 x 128 tiles a block row can see (its sequence's context before its anchor,
its own block), so the other ~85% of the score tiles are never computed. "auto" picks flex on
CUDA, dense elsewhere. Each draft layer is `full_attention` or `sliding_attention`
(`DrafterConfig.layer_types`, `sliding_window` W), with the semantics vLLM, SGLang and SpecForge
serve: a full layer's row sees its sequence's context before its anchor and its whole block; a
sliding layer's row at absolute position p sees keys k <= p with p - k < W (the query counts),
over context and block alike, so it is causal inside the block. Both kinds are still two kv
intervals per row, so the dense reference and the flex BlockMask are built per kind.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import short_conv

try:  # Triton: CUDA installs; CPU-only ones keep the torch ops
    from flashfleet_kernels.norm_rope import norm_rope as norm_rope_kernel
    from flashfleet_kernels.norm_rope import takes_head_dim
    from flashfleet_kernels.swiglu import swiglu as swiglu_kernel
except ImportError:  # pragma: no cover - exercised only where triton is missing
    norm_rope_kernel = swiglu_kernel = takes_head_dim = None


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


SPARE_MASK_ROWS = {151936: 151669, 248320: 248070}  # Qwen3; Qwen3.5/3.6 (the published drafters' ids)


def default_mask_token_id(vocab_size: int) -> int:
    """The published drafters' spare embedding row: 151669 of Qwen3's 151,936 rows, 248070 of
    Qwen3.5/3.6's 248,320; else the last row."""
    return SPARE_MASK_ROWS.get(vocab_size, vocab_size - 1)


def rope_theta_of(cfg) -> float:
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", 1_000_000.0) or 1_000_000.0))


# ---- targets -------------------------------------------------------------------------------------

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

    d = Path(model_dir)
    dev = torch.device(device)
    names = checkpoint_tensors(d)
    if not is_wrapped(names):
        model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=dtype, attn_implementation="sdpa")
        return fast_kernels(model.to(dev).eval().requires_grad_(False))
    from safetensors import safe_open
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    text = check_target_config(AutoConfig.from_pretrained(d, local_files_only=True))
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


LAYER_TYPES = ("full_attention", "sliding_attention")
LAYER_TYPE_ALIASES = {"full": "full_attention", "sliding": "sliding_attention", "swa": "sliding_attention"}
# The published DFlash drafter for Qwen3.6-27B (SpecForge configs/qwen3.6-27b-dflash.json, z-lab's
# Qwen3.6-27B-DFlash): Qwen3 layers of 32 query / 8 KV heads of 128, sliding x (n-1) then full.
HYBRID_DRAFTER = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=2048)


def parse_layer_types(spec, n_layers: int) -> list[str]:
    """'sliding,sliding,full' or a list -> full names; 'sliding*4,full' repeats. ValueError if not n_layers long."""
    items = spec if isinstance(spec, (list, tuple)) else [x.strip() for x in str(spec).split(",") if x.strip()]
    out = []
    for item in items:
        name, _, times = str(item).partition("*")
        name = LAYER_TYPE_ALIASES.get(name.strip(), name.strip())
        if name not in LAYER_TYPES:
            raise ValueError(f"layer type {item!r} is not one of {', '.join(LAYER_TYPES)} (or full, sliding)")
        out += [name] * (int(times) if times.strip() else 1)
    if len(out) != n_layers:
        raise ValueError(f"{len(out)} layer type(s) {out} for {n_layers} draft layer(s)")
    return out


def drafter_defaults(tcfg, num_draft_layers: int) -> dict:
    """The drafter's shape for a target, before flags: a Qwen3 target's own attention shape and all
    layers full; for a hybrid Qwen3.5/3.6 target the published drafter's (32/8 heads of 128,
    sliding_attention x (n-1) then one full_attention, window 2048). MLP: the target's
    intermediate_size (17,408 for the 27B, as published), 3 x hidden for a MoE target that has none."""
    t = text_config_of(tcfg)
    h = t.hidden_size
    inter = getattr(t, "intermediate_size", None) or 3 * h
    if getattr(t, "model_type", None) in HYBRID_TEXT_TYPES:
        types = ["sliding_attention"] * (num_draft_layers - 1) + ["full_attention"]
        return dict(HYBRID_DRAFTER, intermediate_size=inter, layer_types=types)
    return dict(num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                head_dim=getattr(t, "head_dim", None) or h // t.num_attention_heads, intermediate_size=inter,
                layer_types=["full_attention"] * num_draft_layers, sliding_window=None)


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # per draft layer "full_attention" | "sliding_attention"; empty (an older checkpoint) = all full
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None  # W: a sliding layer's query sees keys k <= p with p - k < W
    target_model: str = ""
    model_type: str = "dflash_drafter"
    feature_convention: str = "target_layer_ids[i] = output of decoder layer i = HF hidden_states[i+1]"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.layer_types = list(self.layer_types or ["full_attention"] * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(f"layer_types {self.layer_types} must be {self.num_hidden_layers} of {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and not (self.sliding_window and self.sliding_window >= 1):
            raise ValueError(f"sliding_attention layers need sliding_window >= 1, not {self.sliding_window}")

    @classmethod
    def from_target(cls, tcfg, *, num_draft_layers, target_layer_ids, block_size, mask_token_id, target_model="",
                    **overrides):
        """The drafter for a target config (a composite config is read through its text_config):
        `drafter_defaults`, then any non-None override (num_attention_heads, num_key_value_heads,
        head_dim, intermediate_size, layer_types, sliding_window)."""
        t = text_config_of(tcfg)
        shape = drafter_defaults(t, num_draft_layers)
        shape.update({k: v for k, v in overrides.items() if v is not None})
        shape["layer_types"] = parse_layer_types(shape["layer_types"], num_draft_layers)
        if "sliding_attention" not in shape["layer_types"]:
            shape["sliding_window"] = None
        return cls(hidden_size=t.hidden_size, num_hidden_layers=num_draft_layers,
                   target_layer_ids=list(target_layer_ids), block_size=block_size, mask_token_id=mask_token_id,
                   vocab_size=t.vocab_size, rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
                   rope_theta=rope_theta_of(t), target_model=str(target_model), **shape)

    def num_params(self) -> int:
        """Trainable parameters (fc, norms, layers)."""
        h, nh, nkv, d, i = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                            self.intermediate_size)
        layer = h * nh * d * 2 + h * nkv * d * 2 + 3 * h * i + 2 * h + 2 * d
        return len(self.target_layer_ids) * h * h + 2 * h + self.num_hidden_layers * layer

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _raise_recompile_limit(limit=64):
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), limit))


# On CUDA: RMSNorm and RoPE as torch.compile'd kernels (the same ops), SwiGLU and the flex path's
# attention norms, RoPE and layout as flashfleet_kernels' Triton kernels; off: every op on its own.
FUSE_ELEMENTWISE = True
_COMPILED = {}


def _fused(fn, x):
    """fn itself, or on CUDA fn compiled with dynamic shapes: the same ops in one or two kernels
    instead of a memory pass each (RMSNorm keeps its fp32 accumulation and its rounding to the
    input dtype)."""
    if not (FUSE_ELEMENTWISE and x.is_cuda):
        return fn
    if fn not in _COMPILED:
        _raise_recompile_limit()  # a graph per dtype, rank and grad mode (training, evaluation)
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


def rms_norm(x, weight, eps):
    """In fp32, rounded to x's dtype, scaled by the weight in x's dtype: a bf16 input gives a bf16
    output (an fp32 weight no longer promotes it back to fp32)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(dtype) * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return _fused(rms_norm, x)(x, self.weight, self.eps)


def rope(positions, head_dim, theta):
    """cos, sin [M, head_dim] for integer positions [M] (Qwen3's default RoPE, halves layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    f = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def _apply_rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def apply_rope(x, cos, sin):
    """x [heads, M, d]."""
    return _fused(_apply_rope, x)(x, cos, sin)


def activation_dtype(weight) -> torch.dtype:
    """The dtype the drafter's activations travel in between its layers: autocast's where autocast
    is on (bf16 in training on CUDA), so the residual stream, the context and the norms' outputs are
    already what every matmul takes and no layer casts its input again (fp32 master weights stay
    fp32); the weights' own dtype otherwise (CPU, evaluation without autocast)."""
    dev = weight.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype


def _mm_fp32(a, b):
    """a @ b of bf16 matrices, written in fp32 by the GEMM itself (cuBLAS accumulates in fp32 anyway)."""
    return torch.mm(a, b, out_dtype=torch.float32)


class _AutocastLinear(torch.autograd.Function):
    """x @ [w1; w2; ...].T under bf16 autocast with fp32 master weights, as one GEMM whose weight
    gradients leave the weight-gradient GEMM in fp32. Autocast's own path writes each gradient in
    bf16 and then casts it to the fp32 weight's dtype (ToCopyBackward: one copy kernel per weight a
    step, 3.4 ms of the Qwen3-8B drafter's step on one H200, 5.6 ms at the Qwen3.6-27B drafter
    shape); here that kernel is gone and the gradient is not rounded to bf16 on the way. Weights
    that share an input (K and V, gate and up) are cast side by side into one bf16 matrix, once per
    call as autocast does, and kept for the input's gradient: one GEMM each way instead of one per
    weight, and the input's gradient is not summed over them by a separate kernel."""

    @staticmethod
    def forward(ctx, x, *ws):
        ctx.rows = [w.shape[0] for w in ws]
        wb = x.new_empty(sum(ctx.rows), ws[0].shape[1])
        for part, w in zip(wb.split(ctx.rows), ws, strict=True):
            part.copy_(w)
        ctx.save_for_backward(x, wb)
        return F.linear(x, wb)

    @staticmethod
    def backward(ctx, dy):
        x, wb = ctx.saved_tensors
        dx = dy @ wb if ctx.needs_input_grad[0] else None
        dw = _mm_fp32(dy.reshape(-1, dy.shape[-1]).t(), x.reshape(-1, x.shape[-1]))
        return dx, *dw.split(ctx.rows)


def project(x, *linears, packed: bool = False):
    """[l(x) for l in linears] for the drafter's `Linear`s (no bias), or with `packed` those outputs
    side by side in one tensor (the consumer then takes one gradient: no copy gathers the parts' in
    backward). Under CUDA bf16 autocast with fp32 weights that train, one `_AutocastLinear` GEMM for
    all of them; elsewhere (CPU, evaluation, no grad) each nn.Linear on its own. It calls no module,
    so hooks registered on these layers do not run (the drafter registers none)."""
    ws = [lin.weight for lin in linears]
    if (all(w.dtype == torch.float32 and w.is_cuda and w.requires_grad for w in ws) and torch.is_grad_enabled()
            and torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
            and all(lin.bias is None for lin in linears)):
        with torch.autocast("cuda", enabled=False):
            y = _AutocastLinear.apply(x.to(torch.bfloat16), *ws)
        return y if packed else list(y.split([w.shape[0] for w in ws], dim=-1))
    ys = [nn.Linear.forward(lin, x) for lin in linears]
    return torch.cat(ys, dim=-1) if packed else ys


class Linear(nn.Linear):
    """The drafter's nn.Linear (no bias): under CUDA bf16 autocast with an fp32 weight that trains,
    `_AutocastLinear` (see `project`, which also runs several that share an input as one GEMM);
    elsewhere nn.Linear itself. Same parameters and state dict as nn.Linear."""

    def forward(self, x):
        return project(x, self)[0]


def _layer_mask(mask, layer_type):
    """A layer's dense mask: masks may be one [M, T+M] tensor for every layer, or {layer type: tensor}."""
    return mask[layer_type] if isinstance(mask, dict) else mask


class DraftAttention(nn.Module):
    def __init__(self, c: DrafterConfig, layer_type: str = "full_attention"):
        super().__init__()
        self.layer_type = layer_type
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, self.nh * self.d, bias=False)
        self.k_proj = Linear(c.hidden_size, self.nkv * self.d, bias=False)
        self.v_proj = Linear(c.hidden_size, self.nkv * self.d, bias=False)
        self.o_proj = Linear(self.nh * self.d, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, c.rms_norm_eps)

    def kv(self, x, rope_x):
        """K (normed, rotated) and V [nkv, T, d] of rows x [T, H] at the positions of rope_x."""
        k, v = project(x, self.k_proj, self.v_proj)
        k = self.k_norm(k.view(-1, self.nkv, self.d)).transpose(0, 1)
        return apply_rope(k, *rope_x), v.view(-1, self.nkv, self.d).transpose(0, 1)

    def _placed_by_kernel(self, x) -> bool:
        """Whether `_flex_placed` runs (CUDA, FUSE_ELEMENTWISE, Triton, a head dim the kernel takes)."""
        return FUSE_ELEMENTWISE and x.is_cuda and norm_rope_kernel is not None and takes_head_dim(self.d)

    def _flex_placed(self, x, ctx, rope_q, rope_kv, sparse):
        """The flex path on CUDA: the norms, RoPE and the placement into `sparse`'s padded layout
        as one `norm_rope` kernel for q and one for K beside V (instead of a kernel for each and
        copies around the attention); its output is already [M, heads * d] in memory."""
        m, nkv = x.shape[0], self.nkv
        q = self.q_proj(x).view(m, self.nh, self.d)
        kv = project(torch.cat([ctx, x], dim=0), self.k_proj, self.v_proj, packed=True).view(-1, 2 * nkv, self.d)
        (q,) = norm_rope_kernel(q, self.q_norm.weight, *rope_q, self.q_norm.eps, parts=(self.nh,), normed=self.nh,
                                length=sparse.q_len, split=m)
        k, v = norm_rope_kernel(kv, self.k_norm.weight, *rope_kv, self.k_norm.eps, parts=(nkv, nkv), normed=nkv,
                                length=sparse.kv_len, split=sparse.t, shift=sparse.t_pad - sparse.t)
        o = sparse.attend(q, k, v, self.layer_type, placed=True)
        return self.o_proj(o.transpose(0, 1).reshape(m, self.nh * self.d))

    def forward(self, x, ctx, rope_q, rope_kv, mask, ctx_kv=None):
        """x [M, H] block rows; ctx [T, H] context; mask: [M, T+M] bool (True = may attend), or
        {layer type: such a mask}, for the dense path, or a `SparseAttention` for the flex path (the
        same masks, tile-sparse); this layer uses the one of its own layer type. ctx_kv: the
        context's (K, V) already computed by `kv` (the evaluator's cache; ctx is then unused and
        rope_kv covers the block rows only)."""
        m = x.shape[0]
        if isinstance(mask, SparseAttention) and ctx_kv is None and self._placed_by_kernel(x):
            return self._flex_placed(x, ctx, rope_q, rope_kv, mask)
        q = self.q_norm(self.q_proj(x).view(m, self.nh, self.d)).transpose(0, 1)
        if ctx_kv is None:
            k, v = self.kv(torch.cat([ctx, x], dim=0), rope_kv)
            q = apply_rope(q, *rope_q)
        else:
            kb, vb = self.kv(x, rope_kv)
            q, k, v = apply_rope(q, *rope_q), torch.cat([ctx_kv[0], kb], dim=1), torch.cat([ctx_kv[1], vb], dim=1)
        if isinstance(mask, SparseAttention):
            o = mask.attend(q, k, v, self.layer_type)
            return self.o_proj(o.transpose(0, 1).reshape(m, self.nh * self.d))
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=0)
            v = v.repeat_interleave(self.nh // self.nkv, dim=0)
        o = F.scaled_dot_product_attention(q[None], k[None], v[None],
                                           attn_mask=_layer_mask(mask, self.layer_type)[None, None])
        return self.o_proj(o[0].transpose(0, 1).reshape(m, self.nh * self.d))


def swiglu(gate_up):
    """The MLP's gated activation of [gate | up] side by side (`project(..., packed=True)`), in torch:
    the CPU path and the oracle of the Triton kernels that `_swiglu` runs on CUDA."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _swiglu(gate_up):
    """swiglu, on CUDA (with FUSE_ELEMENTWISE) flashfleet_kernels' Triton kernels: one kernel forward
    and one backward, the backward recomputing silu(gate) and writing both halves' gradients into one
    tensor, as the gate/up GEMM's backward takes it. (Compiled by inductor with dynamic shapes, the
    packed halves took 2x (forward) and 5x (backward) the time of two separate tensors, one H200.)"""
    if FUSE_ELEMENTWISE and gate_up.is_cuda and swiglu_kernel is not None:
        return swiglu_kernel(gate_up)
    return swiglu(gate_up)


class DraftLayer(nn.Module):
    def __init__(self, c: DrafterConfig, layer_type: str = "full_attention"):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c, layer_type)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x, ctx, rope_q, rope_kv, mask, ctx_kv=None):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_kv, mask, ctx_kv)
        h = self.post_attention_layernorm(x)
        gate_up = project(h, self.gate_proj, self.up_proj, packed=True)
        return x + self.down_proj(_swiglu(gate_up))


class DFlashDrafter(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        n = len(c.target_layer_ids)
        self.fc = Linear(n * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c, t) for t in c.layer_types)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.apply(self._init)

    @staticmethod
    def _init(mod):
        if isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, std=0.02)

    def forward(self, block_emb, ctx_feat, ctx_pos, block_pos, mask, ctx_kv=None):
        """block_emb [M, H] embedded block rows; ctx_feat [T, n*H] target features; ctx_pos [T],
        block_pos [M] absolute positions; mask [M, T+M] (every layer), {layer type: [M, T+M]}, or a
        SparseAttention (`drafter_attention` builds the right one). ctx_kv: `context_kv`'s list
        instead of ctx_feat / ctx_pos (the evaluator's cache). Returns the normed output [M, H]."""
        c = self.config
        dt = activation_dtype(self.fc.weight)
        rope_q = rope(block_pos, c.head_dim, c.rope_theta)
        if ctx_kv is None:
            ctx = self.hidden_norm(self.fc(ctx_feat.to(dt)))
            rope_kv, ctx_kv = rope(torch.cat([ctx_pos, block_pos]), c.head_dim, c.rope_theta), [None] * len(self.layers)
        else:
            ctx, rope_kv = None, rope_q
        x = block_emb.to(dt)
        for layer, kv in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, ctx, rope_q, rope_kv, mask, kv)
        return self.norm(x)

    def context_kv(self, ctx_feat, ctx_pos) -> list:
        """Every layer's (K, V) of context positions: the context feature is shared by all layers
        and no layer updates it, so these depend on the target's features alone and can be cached
        and extended position by position (the evaluator does)."""
        c = self.config
        ctx = self.hidden_norm(self.fc(ctx_feat.to(activation_dtype(self.fc.weight))))
        rope_ctx = rope(ctx_pos, c.head_dim, c.rope_theta)
        return [layer.self_attn.kv(ctx, rope_ctx) for layer in self.layers]


def block_attention_inputs(seq, anchor, block_size, sliding_window=None):
    """Context gather indices and the strict DFlash mask for N blocks of one micro-batch (the dense
    reference).

    seq [N], anchor [N]: each block's sequence (in the micro-batch) and anchor position.
    Only context a block can see is gathered: positions < (last anchor) of sequences that have
    blocks. Returns (ctx_seq [T], ctx_pos [T], block_pos [N*B], mask [N*B, T+N*B]) where a block
    row sees context of ITS sequence strictly before ITS anchor (kv < anchor), its own block
    bidirectionally, and nothing else (a full_attention layer). With `sliding_window` W the mask is
    a sliding_attention layer's: of those, a row at absolute position p sees only keys at positions
    k <= p with p - k < W (the query itself counts), context and block alike: causal in the block.
    """
    dev = anchor.device
    ctx_seq, ctx_pos = [], []
    for s in torch.unique(seq).tolist():
        upto = int(anchor[seq == s].max())
        ctx_seq.append(torch.full((upto,), s, dtype=torch.long, device=dev))
        ctx_pos.append(torch.arange(upto, device=dev))
    ctx_seq = torch.cat(ctx_seq) if ctx_seq else torch.zeros(0, dtype=torch.long, device=dev)
    ctx_pos = torch.cat(ctx_pos) if ctx_pos else torch.zeros(0, dtype=torch.long, device=dev)
    n = anchor.shape[0]
    row_block = torch.arange(n, device=dev).repeat_interleave(block_size)
    row_seq, row_anchor = seq[row_block], anchor[row_block]
    slot = torch.arange(block_size, device=dev).repeat(n)
    block_pos = row_anchor + slot
    sees_ctx = (ctx_seq[None, :] == row_seq[:, None]) & (ctx_pos[None, :] < row_anchor[:, None])
    sees_block = row_block[:, None] == row_block[None, :]
    if sliding_window is not None:
        w = int(sliding_window)
        sees_ctx = sees_ctx & (block_pos[:, None] - ctx_pos[None, :] < w)
        back = slot[:, None] - slot[None, :]  # query slot - key slot, inside one block
        sees_block = sees_block & (back >= 0) & (back < w)
    return ctx_seq, ctx_pos, block_pos, torch.cat([sees_ctx, sees_block], dim=1)


def layer_windows(cfg) -> dict:
    """{layer type used by the drafter: its window (None = full_attention)}."""
    return {t: (cfg.sliding_window if t == "sliding_attention" else None) for t in dict.fromkeys(cfg.layer_types)}


ATTN_IMPLS = ("auto", "dense", "flex")
TILE = 128  # flex_attention's sparse block (tile) size, rows and kv alike


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_attn_impl(impl: str, device) -> str:
    """auto -> flex on CUDA (when this torch has flex_attention), dense elsewhere."""
    if impl not in ATTN_IMPLS:
        raise ValueError(f"attn_impl {impl!r} is not one of {ATTN_IMPLS}")
    if impl == "auto":
        return "flex" if torch.device(device).type == "cuda" and flex_available() else "dense"
    return impl


def bucket(n: int) -> int:
    """The padded length for n rows: the smallest 128 x {1, 2, 3, 4, 6, 8, 12, ...} >= n (at most
    1.5x n above 256). Padded rows and kv slots cost memory, not compute (their tiles are absent
    from the BlockMask), and a handful of buckets means a handful of compiled kernels per run."""
    n = max(int(n), 1)
    p = TILE
    while True:
        if p >= n:
            return p
        if p >= 2 * TILE and p * 3 // 2 >= n:
            return p * 3 // 2
        p *= 2


def block_mask_intervals(seq, anchor, block_size, sliding_window=None):
    """The flex layout of a micro-batch: the strict DFlash mask as two kv intervals per row.

    The context is gathered like `block_attention_inputs` does (for each sequence in ascending
    order, positions 0..last anchor-1), so row r of block j (sequence s, anchor a) sees the kv
    interval [start_s, start_s + a) of the context (its sequence, positions < a) and the interval
    of its own block. The block rows start at t_pad, the context length rounded up to a tile,
    so each block lies inside one kv tile. Computed on the CPU (N entries). With `sliding_window`
    W (a sliding_attention layer) both intervals are cut to the window of the row's position
    p = a + k: context [start_s + max(0, p - W + 1), start_s + a), block slots
    [max(0, k - W + 1), k]; still two intervals.

    Returns dict(ctx_seq [T], ctx_pos [T], block_pos [M], lo, hi, blo, bhi [q_len] int32 (padded
    rows: empty intervals), t, t_pad, m, q_len, kv_len).
    """
    seq, anchor = seq.cpu().long(), anchor.cpu().long()
    n = anchor.shape[0]
    seqs, inv = torch.unique(seq, return_inverse=True)
    upto = torch.zeros(len(seqs), dtype=torch.long).scatter_reduce(0, inv, anchor, "amax", include_self=False)
    start = torch.cumsum(upto, 0) - upto
    t = int(upto.sum())
    ctx_seq = torch.repeat_interleave(seqs, upto)
    ctx_pos = torch.arange(t) - torch.repeat_interleave(start, upto)
    m = n * block_size
    t_pad = -(-t // TILE) * TILE
    q_len, kv_len = bucket(m), bucket(t_pad + m)
    row_block = torch.arange(n).repeat_interleave(block_size)
    block_pos = anchor[row_block] + torch.arange(block_size).repeat(n)
    lo, hi, blo, bhi = (torch.zeros(q_len, dtype=torch.int32) for _ in range(4))
    lo[:m] = start[inv][row_block].int()
    hi[:m] = (start[inv] + anchor)[row_block].int()
    blo[:m] = (t_pad + row_block * block_size).int()
    bhi[:m] = blo[:m] + block_size
    if sliding_window is not None:
        w = int(sliding_window)
        slot = torch.arange(block_size).repeat(n)
        lo[:m] = lo[:m] + (block_pos - w + 1).clamp(min=0).int()
        lo[:m] = torch.minimum(lo[:m], hi[:m])  # an empty context interval stays empty
        bhi[:m] = blo[:m] + slot.int() + 1
        blo[:m] = blo[:m] + (slot - w + 1).clamp(min=0).int()
    return dict(ctx_seq=ctx_seq, ctx_pos=ctx_pos, block_pos=block_pos, lo=lo, hi=hi, blo=blo, bhi=bhi, t=t,
                t_pad=t_pad, m=m, q_len=q_len, kv_len=kv_len)


def interval_mask_mod(lo, hi, blo, bhi):
    """flex_attention's mask_mod: kv inside the row's context interval or its own block's."""

    def mask_mod(b, h, q_idx, kv_idx):
        return ((kv_idx >= lo[q_idx]) & (kv_idx < hi[q_idx])) | ((kv_idx >= blo[q_idx]) & (kv_idx < bhi[q_idx]))

    return mask_mod


def _ordered(tiles):
    """[Qb, Kb] bool -> (count [1, 1, Qb], indices [1, 1, Qb, Kb]) int32, listed tiles first."""
    num = tiles.sum(-1, dtype=torch.int32)
    idx = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num[None, None].contiguous(), idx[None, None].contiguous()


def interval_block_mask(lo, hi, blo, bhi, q_len, kv_len):
    """The BlockMask of the interval mask, classified per 128 x 128 tile without a dense mask:
    a tile is full when every row of it covers the whole tile with one interval, partial (mask_mod
    applied) when some row touches it, absent otherwise. Work is O(q_len x kv_len / 128)."""
    from torch.nn.attention.flex_attention import BlockMask

    ks = torch.arange(0, kv_len, TILE, device=lo.device, dtype=torch.int32)[None, :]
    ke = ks + TILE
    lo2, hi2, blo2, bhi2 = lo[:, None], hi[:, None], blo[:, None], bhi[:, None]
    touch = ((lo2 < ke) & (hi2 > ks) & (hi2 > lo2)) | ((blo2 < ke) & (bhi2 > ks) & (bhi2 > blo2))
    cover = ((lo2 <= ks) & (hi2 >= ke)) | ((blo2 <= ks) & (bhi2 >= ke))
    qb, kb = q_len // TILE, kv_len // TILE
    full = cover.view(qb, TILE, kb).all(1)
    partial = touch.view(qb, TILE, kb).any(1) & ~full
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=TILE,
                                    mask_mod=interval_mask_mod(lo, hi, blo, bhi),
                                    seq_lengths=(q_len, kv_len))


_FLEX = {}
# flex_attention's kernel_options for the drafter's attention (tile sizes, warps and stages of its
# forward and backward kernels; None: inductor's defaults for the GPU). Set from measurements
# (tests/benchmarks/bench_flex.py, docs/benchmarks.md).
FLEX_KERNEL_OPTIONS = None


def _flex_fn(device_type: str):
    """flex_attention compiled with static shapes on CUDA (one kernel per (q_len, kv_len) bucket);
    on CPU torch's unfused reference (a test path: it materializes the scores)."""
    if device_type not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        if device_type == "cuda":
            _raise_recompile_limit()  # one entry per (q_len, kv_len) bucket pair
            _FLEX[device_type] = torch.compile(flex_attention, dynamic=False)
        else:
            _FLEX[device_type] = flex_attention
    return _FLEX[device_type]


class SparseAttention:
    """The flex path's attention for one micro-batch (shared by every draft layer): one BlockMask
    per layer type and the padded layout (context at kv [0, t), block rows at kv [t_pad, t_pad + m),
    rows padded to q_len, kv to kv_len; the same for every kind).

    layouts: one `block_mask_intervals` layout (every layer uses it), or {layer type: layout}.
    Building it queues the copies and the BlockMasks' ~30 small kernels per layer type; made ahead
    (`Prepared.to_device`, behind the previous micro-batch's backward) they leave the forward's
    start, where each waited for the host's launch."""

    def __init__(self, layouts, device):
        if "lo" in layouts:
            layouts = {None: layouts}
        layout = next(iter(layouts.values()))
        # the context's gather indices and the rows' positions, the same for every layer type
        self.ctx_seq, self.ctx_pos, self.block_pos = (layout[k].to(device, non_blocking=True)
                                                      for k in ("ctx_seq", "ctx_pos", "block_pos"))
        self.t, self.t_pad, self.m = layout["t"], layout["t_pad"], layout["m"]
        self.q_len, self.kv_len = layout["q_len"], layout["kv_len"]
        self.block_masks = {}
        for kind, lay in layouts.items():
            assert (lay["t"], lay["m"], lay["q_len"], lay["kv_len"]) == (self.t, self.m, self.q_len, self.kv_len)
            lo, hi, blo, bhi = (lay[k].to(device, non_blocking=True) for k in ("lo", "hi", "blo", "bhi"))
            self.block_masks[kind] = interval_block_mask(lo, hi, blo, bhi, self.q_len, self.kv_len)
        self.block_mask = next(iter(self.block_masks.values()))
        self.device_type = torch.device(device).type

    def attend(self, q, k, v, layer_type=None, placed=False):
        """q [nh, M, d], k/v [nkv, T+M, d] (rotated) -> o [nh, M, d], under the BlockMask of
        `layer_type` (the only one when built from one layout). GQA without copies. `placed`: q, k
        and v are already in the padded layout ([nh, q_len, d], [nkv, kv_len, d])."""
        block_mask = self.block_masks[None if None in self.block_masks else layer_type]
        if not placed:
            dt = v.dtype  # SDPA under autocast runs in the autocast dtype, which v_proj's output has
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            q = F.pad(q, (0, 0, 0, self.q_len - self.m))

            def place(x):
                z = x.new_zeros
                nkv, _, d = x.shape
                return torch.cat([x[:, :self.t], z(nkv, self.t_pad - self.t, d), x[:, self.t:],
                                  z(nkv, self.kv_len - self.t_pad - self.m, d)], dim=1)

            k, v = place(k), place(v)
        with torch.autocast(self.device_type, enabled=False):
            o = _flex_fn(self.device_type)(q[None], k[None], v[None], block_mask=block_mask,
                                           enable_gqa=q.shape[0] != k.shape[0],
                                           kernel_options=FLEX_KERNEL_OPTIONS if self.device_type == "cuda" else None)
        return o.squeeze(0)[:, : self.m]  # a view (o[0]'s backward would copy the gradient into zeros)


def flex_layouts(cfg, blocks) -> dict:
    """{layer type: `block_mask_intervals` layout} of a micro-batch's blocks: host work only, so the
    trainer can build it ahead, while the previous micro-batch still runs on the device."""
    b = blocks.input_ids.shape[1]
    return {t: block_mask_intervals(blocks.seq, blocks.anchor, b, w) for t, w in layer_windows(cfg).items()}


def gather_rows(x, i, j) -> torch.Tensor:
    """x[i, j] for x [S, T, ...] and integer index tensors i, j (broadcast together), as one
    index_select over x's first two dimensions flattened: the advanced-indexing kernel behind
    x[i, j] computes offsets per element (the drafter's context and teacher-row gathers, 1.2 ms of
    the Qwen3-8B drafter's step on one H200); index_select copies whole rows. j must lie in
    [0, T) (the callers' positions do): past it, x[i, j] raises where this reads row (i+1, ...)."""
    flat = i.to(torch.int64) * x.shape[1] + j
    out = x.reshape(-1, *x.shape[2:]).index_select(0, flat.reshape(-1))
    return out.view(*flat.shape, *x.shape[2:])


def context_noise(shape, gen, device) -> torch.Tensor:
    """Standard normal noise for the gathered context, drawn from the micro-batch's generator `gen`
    (CPU; None: the global one), so it depends on the micro-batch, not on the topology. On the CPU
    straight from it; on a GPU from a device generator seeded by one draw of it: drawing the
    context's T x n*H numbers on the host took longer than the drafter's whole step (1.4 s for the
    Qwen3-8B shape's 167M on two cores) and then a copy of that size to the device."""
    if torch.device(device).type == "cpu":
        return torch.randn(shape, generator=gen)
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return torch.randn(shape, generator=torch.Generator(device=device).manual_seed(seed), device=device)


def drafter_hidden(drafter, embed_weight, features, blocks, noise_scale=0.0, gen=None, attn_impl="dense",
                   layouts=None):
    """Run the drafter on all blocks of a micro-batch. features [S, T, n*H] (right-padded per
    sequence). Noise is added to the gathered context, scaled by each token's feature RMS so the
    scale means the same at any width. attn_impl: dense (the reference), flex or auto (flex on
    CUDA). layouts (flex only): `flex_layouts` of these blocks or their `SparseAttention` on this
    device, when built ahead. Returns the student hidden [N, B, H]."""
    n, b = blocks.input_ids.shape
    dev = features.device
    windows = layer_windows(drafter.config)  # one mask per layer type the drafter has
    if resolve_attn_impl(attn_impl, dev) == "flex":
        mask = layouts if isinstance(layouts, SparseAttention) else SparseAttention(
            layouts if layouts is not None else flex_layouts(drafter.config, blocks), dev)
        ctx_seq, ctx_pos, block_pos = mask.ctx_seq, mask.ctx_pos, mask.block_pos
    else:
        seq, anchor = blocks.seq.to(dev), blocks.anchor.to(dev)
        mask = {}
        for t, w in windows.items():
            ctx_seq, ctx_pos, block_pos, mask[t] = block_attention_inputs(seq, anchor, b, w)
    ctx = gather_rows(features, ctx_seq, ctx_pos)
    if noise_scale > 0:
        rms = ctx.float().pow(2).mean(-1, keepdim=True).sqrt()
        eps = context_noise(ctx.shape, gen, dev)
        ctx = (ctx.float() + noise_scale * rms * eps).to(ctx.dtype)
    emb = F.embedding(blocks.input_ids.to(dev, non_blocking=True).reshape(-1), embed_weight)
    out = drafter(emb, ctx, ctx_pos, block_pos, mask)
    return out.view(n, b, -1)


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


CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")  # what transformers names a layer's KV cache, by version


def cache_kwarg(module) -> str:
    """The name `module.forward` takes its KV cache by: `cache` from transformers 5.24 (where
    `past_key_values` still works until 5.40, with a warning), `past_key_values` before."""
    import inspect

    params = inspect.signature(module.forward).parameters
    return next((k for k in CACHE_KWARGS if k in params), "past_key_values")


class _CompiledUnlessCached:
    """A decoder layer's forward, compiled (dynamic shapes) for the training forwards, which carry
    no KV cache; the evaluator's cached forwards (`past_key_values`) keep the eager one, so a cache
    object never enters a compiled graph."""

    def __init__(self, eager, backend, mode=None):
        self.eager, self.compiled = eager, torch.compile(eager, dynamic=True, backend=backend, mode=mode)

    def __call__(self, *args, **kwargs):
        cached = any(kwargs.get(k) is not None for k in CACHE_KWARGS)
        return (self.eager if cached else self.compiled)(*args, **kwargs)


def compile_decoder_layers(model, backend="inductor", mode=None) -> int:
    """Compile each decoder layer's forward in place (the forward hooks stay outside the graph):
    inductor fuses the memory-bound work around the GEMMs (RMSNorm's fp32 round trip, RoPE, SwiGLU,
    residual adds), 1.29x target tokens/s at the Qwen3-8B shape on one H200 (docs/benchmarks.md).
    Every layer of a stack shares one compiled graph per layer class. A hybrid stack's
    linear-attention layers are compiled in parts instead (`_compile_parts`): their token mixer
    calls flash-linear-attention's Triton kernels, which compiling the whole layer around did not
    finish in minutes. `mode` is torch.compile's (None: inductor's default). Returns the layers
    compiled, whole or in parts."""
    _raise_recompile_limit()  # length groups: a few batch/length specializations at most
    layers = model.get_decoder().layers
    for layer in layers:
        if hasattr(layer, "linear_attn"):
            _compile_parts(layer, backend, mode)
        elif not isinstance(layer.forward, _CompiledUnlessCached):
            layer.forward = _CompiledUnlessCached(layer.forward, backend, mode)
    return len(layers)


def _compile_parts(layer, backend, mode=None) -> None:
    """A linear-attention layer's norms (its gated output norm too) and MLP compiled in place: the
    same fusions as a whole layer's, the token mixer between them eager. None of them takes a cache."""
    for sub in (layer.input_layernorm, layer.post_attention_layernorm, layer.mlp, layer.linear_attn.norm):
        if not hasattr(sub.forward, "_torchdynamo_orig_callable"):  # compiled already
            sub.forward = torch.compile(sub.forward, dynamic=True, backend=backend, mode=mode)


def compiled_by_default(device) -> bool:
    """Whether a target replica's layers are compiled (`compile_decoder_layers`) unless told not to:
    on CUDA (1.29x target tokens/s at the Qwen3-8B shape, 1.16x at the Qwen3.6-27B hybrid shape, on
    one H200; docs/benchmarks.md), where inductor's kernels run; a CPU target stays eager."""
    return torch.device(device).type == "cuda"


def compile_note(layers: int) -> str:
    """The status line of a compiled target replica: the compile happens inside the first forward,
    so say why that micro-batch is slow (first target forwards measured on one H200)."""
    return (f"{layers} decoder layers compile in the first micro-batch (under 20 s at the Qwen3-8B shape; "
            "about 85 s at the Qwen3.6-27B shape, whose linear-attention kernels also autotune)")


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
    def for_training(cls, args, devices, layer_ids, out_device, on_status=None):
        """A training feed's producer: dflash-train's --target-model, its layers compiled unless
        --target-compile off."""
        return cls(args.target_model, devices, layer_ids, out_device, on_status=on_status,
                   compile_layers=args.target_compile != "off")

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


def load_drafter(checkpoint_dir, device="cpu") -> DFlashDrafter:
    """A drafter from a checkpoint directory alone (drafter.safetensors + config.json)."""
    from safetensors.torch import load_file

    d = Path(checkpoint_dir)
    cfg = DrafterConfig.from_dict(json.loads((d / "config.json").read_text()))
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(load_file(str(d / "drafter.safetensors"), device=str(device)))
    return drafter.to(device).eval()

