"""The DFlash drafter: its config, its modules, and its forward over a micro-batch's blocks.

Drafter architecture (dflash.md): concat of the chosen layers' features -> bias-free Linear
(n*H -> H) -> RMSNorm gives one context feature shared by all draft layers. Each draft layer is
a Qwen3 decoder layer whose attention is NOT causal: Q from the block, K/V from
[context ; block] through the same k_proj/v_proj, QK-norm, RoPE at absolute positions. The
block is [anchor token, MASK x (B-1)] embedded with the target's frozen embedding; outputs go
through the target's frozen LM head. The drafter owns no embedding or head.

Its attention masks and their flex (tile-sparse) form live in attention.py; the target whose
features it reads, in target.py.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import SparseAttention, block_attention_inputs, flex_layouts, layer_windows, resolve_attn_impl
from .compilation import raise_recompile_limit
from .defaults import DFLASH2, DRAFTER_KINDS, HYBRID_DRAFTER, MOE_MLP_PER_HIDDEN, SPARE_MASK_ROWS
from .dflash2 import SHAPE as DFLASH2_SHAPE
from .dflash2 import CandidateSelector, GroupedDynamicConv, dflash2_problem, grouped_conv
from .target import HYBRID_TEXT_TYPES, rope_theta_of, text_config_of

try:  # Triton: CUDA installs; CPU-only ones keep the torch ops
    from flashfleet_kernels.grouped_conv import grouped_conv as conv_kernel
    from flashfleet_kernels.grouped_conv import takes_shape as conv_takes_shape
    from flashfleet_kernels.norm_rope import norm_rope as norm_rope_kernel
    from flashfleet_kernels.norm_rope import takes_head_dim
    from flashfleet_kernels.swiglu import swiglu as swiglu_kernel
except ImportError:  # pragma: no cover - exercised only where triton is missing
    norm_rope_kernel = swiglu_kernel = takes_head_dim = conv_kernel = conv_takes_shape = None


MASK_ROW_OF_VOCAB = dict(SPARE_MASK_ROWS.values())  # vocabulary rows -> the published drafters' mask row


def default_mask_token_id(vocab_size: int) -> int:
    """The published drafters' spare embedding row for the target's vocabulary
    (defaults.SPARE_MASK_ROWS); else the last row."""
    return MASK_ROW_OF_VOCAB.get(vocab_size, vocab_size - 1)


LAYER_TYPES = ("full_attention", "sliding_attention")
LAYER_TYPE_ALIASES = {"full": "full_attention", "sliding": "sliding_attention", "swa": "sliding_attention"}


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


def drafter_defaults(tcfg, num_draft_layers: int, drafter_kind: str = "dflash") -> dict:
    """The drafter's shape for a target, before flags: a Qwen3 target's own attention shape and all
    layers full; for a hybrid Qwen3.5/3.6/3.8 target the published drafter's (defaults.HYBRID_DRAFTER:
    its heads and window), its layers DFlash's sliding_attention x (n-1) then one full_attention
    (z-lab's Qwen3.6-27B-DFlash), or for DFlash 2 all sliding_attention (z-lab's Qwen3.8-27B-DFlash2,
    defaults.DFLASH2_TARGET_LAYERS' note). MLP: the target's intermediate_size (17,408 for the 27B,
    as published), defaults.MOE_MLP_PER_HIDDEN x hidden for a MoE target that has none."""
    t = text_config_of(tcfg)
    h = t.hidden_size
    inter = getattr(t, "intermediate_size", None) or MOE_MLP_PER_HIDDEN * h
    if getattr(t, "model_type", None) in HYBRID_TEXT_TYPES:
        full = 0 if drafter_kind == "dflash2" else 1
        types = ["sliding_attention"] * (num_draft_layers - full) + ["full_attention"] * full
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
    # True: sliding layers see their block both ways, |p - k| < W (DFlash 2's, speculators' name; the
    # format's is_causal false); False (DFlash, and a checkpoint from before the field): causal in it
    sliding_window_non_causal: bool = False
    target_model: str = ""
    # "dflash" | "dflash2" (dflash2.py: convolutions and a candidate selector, their four settings;
    # None for dflash, so a DFlash checkpoint's config is what it was)
    drafter_kind: str = "dflash"
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    model_type: str = "dflash_drafter"
    feature_convention: str = "target_layer_ids[i] = output of decoder layer i = HF hidden_states[i+1]"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.layer_types = list(self.layer_types or ["full_attention"] * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(f"layer_types {self.layer_types} must be {self.num_hidden_layers} of {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and not (self.sliding_window and self.sliding_window >= 1):
            raise ValueError(f"sliding_attention layers need sliding_window >= 1, not {self.sliding_window}")
        if self.drafter_kind not in DRAFTER_KINDS:
            raise ValueError(f"drafter_kind {self.drafter_kind!r} is not one of {', '.join(DRAFTER_KINDS)}")
        if self.drafter_kind == "dflash2":
            for k in DFLASH2_SHAPE:
                if getattr(self, k) is None:
                    setattr(self, k, DFLASH2[k])
            problem = dflash2_problem(self.hidden_size, self.block_size, self.vocab_size, self.conv_kernel_size,
                                      self.conv_group_size, self.selector_top_k)
            if problem:
                raise ValueError(problem[0])
        else:
            self.conv_kernel_size = self.conv_group_size = self.selector_rank = self.selector_top_k = None

    @classmethod
    def from_target(cls, tcfg, *, num_draft_layers, target_layer_ids, block_size, mask_token_id, target_model="",
                    **overrides):
        """The drafter for a target config (a composite config is read through its text_config):
        `drafter_defaults`, then any non-None override (num_attention_heads, num_key_value_heads,
        head_dim, intermediate_size, layer_types, sliding_window; drafter_kind and, for dflash2, its
        conv_kernel_size, conv_group_size, selector_rank, selector_top_k)."""
        t = text_config_of(tcfg)
        shape = drafter_defaults(t, num_draft_layers, overrides.get("drafter_kind") or "dflash")
        shape.update({k: v for k, v in overrides.items() if v is not None})
        shape["layer_types"] = parse_layer_types(shape["layer_types"], num_draft_layers)
        if "sliding_attention" not in shape["layer_types"]:
            shape["sliding_window"] = None
        # DFlash 2's sliding layers see their whole block, as speculators trains them (its dflash2
        # default sliding_window_non_causal) and the published drafter is served (is_causal false)
        shape["sliding_window_non_causal"] = (shape.get("drafter_kind") == "dflash2"
                                              and "sliding_attention" in shape["layer_types"])
        return cls(hidden_size=t.hidden_size, num_hidden_layers=num_draft_layers,
                   target_layer_ids=list(target_layer_ids), block_size=block_size, mask_token_id=mask_token_id,
                   vocab_size=t.vocab_size, rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
                   rope_theta=rope_theta_of(t), target_model=str(target_model), **shape)

    def num_params(self) -> int:
        """Trainable parameters (fc, norms, layers; DFlash 2's convolutions and selector)."""
        h, nh, nkv, d, i = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                            self.intermediate_size)
        layer = h * nh * d * 2 + h * nkv * d * 2 + 3 * h * i + 2 * h + 2 * d
        extra = 0
        if self.drafter_kind == "dflash2":  # two convolutions a layer; the selector's codebooks and projection
            taps, groups, r = self.conv_kernel_size, h // self.conv_group_size, self.selector_rank
            layer += 2 * (2 * taps * h + 2 * taps * groups * h)
            extra = 2 * self.vocab_size * r + r * h
        return len(self.target_layer_ids) * h * h + 2 * h + self.num_hidden_layers * layer + extra

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


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
        raise_recompile_limit()  # a graph per dtype, rank and grad mode (training, evaluation)
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


def _grouped_conv(x, groups):
    """DFlash 2's convolution for x with `groups` groups: on CUDA (with FUSE_ELEMENTWISE)
    flashfleet_kernels' Triton kernels where they take the group size (one kernel forward, one
    backward with both coefficient gradients; compiled by inductor the same took about 10x its
    memory traffic's time, docs/benchmarks.md), else dflash2.grouped_conv (compiled on CUDA)."""
    if FUSE_ELEMENTWISE and x.is_cuda and conv_kernel is not None and conv_takes_shape(x.shape[-1], groups):
        return conv_kernel
    return _fused(grouped_conv, x)


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
        self.attention_conv = self.mlp_conv = None  # DFlash 2: a convolution pair around each sublayer
        if c.drafter_kind == "dflash2":
            conv = (c.hidden_size, c.conv_kernel_size, c.conv_group_size, c.block_size)
            self.attention_conv, self.mlp_conv = GroupedDynamicConv(*conv), GroupedDynamicConv(*conv)

    def forward(self, x, ctx, rope_q, rope_kv, mask, ctx_kv=None):
        """x [M, H]: whole blocks, one after another (DFlash 2's convolutions take row % block size
        as the block position)."""
        h = self.input_layernorm(x)
        conv = _grouped_conv(x, self.attention_conv.groups) if self.attention_conv is not None else None
        if self.attention_conv is not None:
            h, delta = self.attention_conv.prepare(h, conv)
        a = self.self_attn(h, ctx, rope_q, rope_kv, mask, ctx_kv)
        x = x + (a if self.attention_conv is None else self.attention_conv.finish(a, delta, conv))
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            h, delta = self.mlp_conv.prepare(h, conv)
        m = self.down_proj(_swiglu(project(h, self.gate_proj, self.up_proj, packed=True)))
        return x + (m if self.mlp_conv is None else self.mlp_conv.finish(m, delta, conv))


class DFlashDrafter(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        n = len(c.target_layer_ids)
        self.fc = Linear(n * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c, t) for t in c.layer_types)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # DFlash 2's selector (drafter.selector, selector.top_k, selector.transition_scores); None for DFlash
        self.selector = (CandidateSelector(c.hidden_size, c.vocab_size, c.selector_rank, c.selector_top_k)
                         if c.drafter_kind == "dflash2" else None)
        self.apply(self._init)
        for mod in self.modules():  # the convolutions start as the identity (apply drew their projections)
            if isinstance(mod, GroupedDynamicConv):
                mod.reset_parameters()

    @property
    def candidates_k(self) -> int:
        """The unary candidates a step's loss takes for the selector (drafter_loss's top_k): DFlash
        2's selector top-k, 0 for DFlash."""
        return self.selector.top_k if self.selector is not None else 0

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
            ctx_seq, ctx_pos, block_pos, mask[t] = block_attention_inputs(seq, anchor, b, **w)
    ctx = gather_rows(features, ctx_seq, ctx_pos)
    if noise_scale > 0:
        rms = ctx.float().pow(2).mean(-1, keepdim=True).sqrt()
        eps = context_noise(ctx.shape, gen, dev)
        ctx = (ctx.float() + noise_scale * rms * eps).to(ctx.dtype)
    emb = F.embedding(blocks.input_ids.to(dev, non_blocking=True).reshape(-1), embed_weight)
    out = drafter(emb, ctx, ctx_pos, block_pos, mask)
    return out.view(n, b, -1)


def load_drafter(checkpoint_dir, device="cpu") -> DFlashDrafter:
    """A drafter from a checkpoint directory alone (drafter.safetensors + config.json)."""
    from safetensors.torch import load_file

    d = Path(checkpoint_dir)
    cfg = DrafterConfig.from_dict(json.loads((d / "config.json").read_text()))
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(load_file(str(d / "drafter.safetensors"), device=str(device)))
    return drafter.to(device).eval()
