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
CUDA, dense elsewhere.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """num_draft_layers ids spread evenly from 1 to L-3 (Qwen3 36 layers, 5 -> [1, 9, 17, 25, 33])."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def default_mask_token_id(vocab_size: int) -> int:
    """Qwen3's spare embedding row 151669 for its 151,936-row vocab; else the last row."""
    return 151669 if vocab_size == 151936 else vocab_size - 1


def rope_theta_of(cfg) -> float:
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", 1_000_000.0) or 1_000_000.0))


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
    target_model: str = ""
    model_type: str = "dflash_drafter"
    feature_convention: str = "target_layer_ids[i] = output of decoder layer i = HF hidden_states[i+1]"
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_target(cls, tcfg, *, num_draft_layers, target_layer_ids, block_size, mask_token_id, target_model=""):
        return cls(
            hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
            num_attention_heads=tcfg.num_attention_heads, num_key_value_heads=tcfg.num_key_value_heads,
            head_dim=getattr(tcfg, "head_dim", None) or tcfg.hidden_size // tcfg.num_attention_heads,
            num_hidden_layers=num_draft_layers, target_layer_ids=list(target_layer_ids), block_size=block_size,
            mask_token_id=mask_token_id, vocab_size=tcfg.vocab_size, rms_norm_eps=tcfg.rms_norm_eps,
            rope_theta=rope_theta_of(tcfg), target_model=str(target_model))

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


FUSE_ELEMENTWISE = True  # on CUDA, RMSNorm and RoPE run as torch.compile'd kernels (the same ops)
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
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


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


class DraftAttention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.nkv * self.d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.nkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.nh * self.d, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, c.rms_norm_eps)

    def forward(self, x, ctx, rope_q, rope_kv, mask):
        """x [M, H] block rows; ctx [T, H] context; mask: [M, T+M] bool (True = may attend) for the
        dense path, or a `SparseAttention` for the flex path (the same mask, tile-sparse)."""
        m = x.shape[0]
        kv_in = torch.cat([ctx, x], dim=0)
        q = self.q_norm(self.q_proj(x).view(m, self.nh, self.d)).transpose(0, 1)
        k = self.k_norm(self.k_proj(kv_in).view(-1, self.nkv, self.d)).transpose(0, 1)
        v = self.v_proj(kv_in).view(-1, self.nkv, self.d).transpose(0, 1)
        q, k = apply_rope(q, *rope_q), apply_rope(k, *rope_kv)
        if isinstance(mask, SparseAttention):
            return self.o_proj(mask.attend(q, k, v).transpose(0, 1).reshape(m, self.nh * self.d))
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=0)
            v = v.repeat_interleave(self.nh // self.nkv, dim=0)
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask[None, None])
        return self.o_proj(o[0].transpose(0, 1).reshape(m, self.nh * self.d))


class DraftLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x, ctx, rope_q, rope_kv, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_kv, mask)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DFlashDrafter(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        n = len(c.target_layer_ids)
        self.fc = nn.Linear(n * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.apply(self._init)

    @staticmethod
    def _init(mod):
        if isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, std=0.02)

    def forward(self, block_emb, ctx_feat, ctx_pos, block_pos, mask):
        """block_emb [M, H] embedded block rows; ctx_feat [T, n*H] target features; ctx_pos [T],
        block_pos [M] absolute positions; mask [M, T+M]. Returns the normed output [M, H]."""
        c = self.config
        ctx = self.hidden_norm(self.fc(ctx_feat.to(self.fc.weight.dtype)))
        rope_q = rope(block_pos, c.head_dim, c.rope_theta)
        rope_kv = rope(torch.cat([ctx_pos, block_pos]), c.head_dim, c.rope_theta)
        x = block_emb.to(self.fc.weight.dtype)
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_kv, mask)
        return self.norm(x)


def block_attention_inputs(seq, anchor, block_size):
    """Context gather indices and the strict DFlash mask for N blocks of one micro-batch.

    seq [N], anchor [N]: each block's sequence (in the micro-batch) and anchor position.
    Only context a block can see is gathered: positions < (last anchor) of sequences that have
    blocks. Returns (ctx_seq [T], ctx_pos [T], block_pos [N*B], mask [N*B, T+N*B]) where a block
    row sees context of ITS sequence strictly before ITS anchor (kv < anchor), its own block
    bidirectionally, and nothing else.
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
    block_pos = row_anchor + torch.arange(block_size, device=dev).repeat(n)
    sees_ctx = (ctx_seq[None, :] == row_seq[:, None]) & (ctx_pos[None, :] < row_anchor[:, None])
    sees_block = row_block[:, None] == row_block[None, :]
    return ctx_seq, ctx_pos, block_pos, torch.cat([sees_ctx, sees_block], dim=1)


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


def block_mask_intervals(seq, anchor, block_size):
    """The flex layout of a micro-batch: the strict DFlash mask as two kv intervals per row.

    The context is gathered like `block_attention_inputs` does (for each sequence in ascending
    order, positions 0..last anchor-1), so row r of block j (sequence s, anchor a) sees the kv
    interval [start_s, start_s + a) of the context (its sequence, positions < a) and the interval
    of its own block. The block rows start at t_pad, the context length rounded up to a tile,
    so each block lies inside one kv tile. Computed on the CPU (N entries).

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
    """The flex path's attention for one micro-batch (shared by every draft layer): the BlockMask
    and the padded layout (context at kv [0, t), block rows at kv [t_pad, t_pad + m), rows padded
    to q_len, kv to kv_len)."""

    def __init__(self, layout, device):
        self.t, self.t_pad, self.m = layout["t"], layout["t_pad"], layout["m"]
        self.q_len, self.kv_len = layout["q_len"], layout["kv_len"]
        lo, hi, blo, bhi = (layout[k].to(device, non_blocking=True) for k in ("lo", "hi", "blo", "bhi"))
        self.block_mask = interval_block_mask(lo, hi, blo, bhi, self.q_len, self.kv_len)
        self.device_type = torch.device(device).type

    def attend(self, q, k, v):
        """q [nh, M, d], k/v [nkv, T+M, d] (rotated) -> o [nh, M, d]. GQA without copies."""
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
            o = _flex_fn(self.device_type)(q[None], k[None], v[None], block_mask=self.block_mask,
                                           enable_gqa=q.shape[0] != k.shape[0])
        return o[0, :, : self.m]


def drafter_hidden(drafter, embed_weight, features, blocks, noise_scale=0.0, gen=None, attn_impl="dense"):
    """Run the drafter on all blocks of a micro-batch. features [S, T, n*H] (right-padded per
    sequence). Noise is added to the gathered context, scaled by each token's feature RMS so the
    scale means the same at any width. attn_impl: dense (the reference), flex or auto (flex on
    CUDA). Returns the student hidden [N, B, H]."""
    n, b = blocks.input_ids.shape
    dev = features.device
    if resolve_attn_impl(attn_impl, dev) == "flex":
        layout = block_mask_intervals(blocks.seq, blocks.anchor, b)
        ctx_seq, ctx_pos, block_pos = (layout[k].to(dev, non_blocking=True) for k in ("ctx_seq", "ctx_pos", "block_pos"))
        mask = SparseAttention(layout, dev)
    else:
        seq, anchor = blocks.seq.to(dev), blocks.anchor.to(dev)
        ctx_seq, ctx_pos, block_pos, mask = block_attention_inputs(seq, anchor, b)
    ctx = features[ctx_seq, ctx_pos]
    if noise_scale > 0:
        rms = ctx.float().pow(2).mean(-1, keepdim=True).sqrt()
        eps = torch.randn(ctx.shape, generator=gen, device="cpu").to(dev)
        ctx = (ctx.float() + noise_scale * rms * eps).to(ctx.dtype)
    emb = F.embedding(blocks.input_ids.to(dev, non_blocking=True).reshape(-1), embed_weight)
    out = drafter(emb, ctx, ctx_pos, block_pos, mask)
    return out.view(n, b, -1)


class HiddenStateProducer:
    """The frozen target, one replica per target device; produces features for micro-batches."""

    def __init__(self, model_dir, devices, layer_ids, out_device, on_status=None):
        from transformers import AutoModelForCausalLM

        self.layer_ids, self.out_device, self.replicas, self._next = list(layer_ids), out_device, [], 0
        for i, dev in enumerate(devices):
            if on_status:
                on_status(f"loading target {i + 1}/{len(devices)} on {dev}")
            dtype = torch.float32 if dev == "cpu" else torch.bfloat16
            model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype,
                                                         attn_implementation="sdpa")
            model.to(dev).eval().requires_grad_(False)
            self.replicas.append((dev, model))
            if on_status:
                on_status(f"target {i + 1}/{len(devices)} loaded")
        model = self.replicas[0][1]
        self.config = model.config
        # The drafter's frozen embedding and LM head, on the drafter's device, in its dtype.
        self.embed_weight = model.get_input_embeddings().weight.detach().to(out_device)
        self.lm_head_weight = model.get_output_embeddings().weight.detach().to(out_device)

    @torch.no_grad()
    def forward(self, input_ids, attention_mask=None, replica=None):
        """input_ids [S, T] -> (features [S, T, n*H], last normed hidden [S, T, H]) on out_device."""
        if replica is None:
            replica = self._next
            self._next = (self._next + 1) % len(self.replicas)
        dev, model = self.replicas[replica]
        decoder = model.get_decoder()
        captured = {}
        hooks = [decoder.layers[i].register_forward_hook(
            lambda _m, _inp, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
            for i in sorted(set(self.layer_ids))]
        try:
            out = decoder(input_ids=input_ids.to(dev),
                          attention_mask=None if attention_mask is None else attention_mask.to(dev), use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        feats = torch.cat([captured[i] for i in self.layer_ids], dim=-1)
        return feats.to(self.out_device), out.last_hidden_state.to(self.out_device)


def load_frozen_io(model_dir, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding weight, LM head weight) of the target, read from its safetensors shards only.

    A drafter rank in its own process needs these two matrices but not the target's layers, so it
    reads just them (mmap'd by safetensors) instead of loading a whole replica. A tied head is
    the embedding. Falls back to loading the model on CPU for a .bin-only checkpoint.
    """
    from safetensors import safe_open

    d = Path(model_dir)
    embed = head = None
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open has keys(), not __iter__)
                if embed is None and key.endswith("embed_tokens.weight"):
                    embed = st.get_tensor(key)
                elif head is None and key.endswith("lm_head.weight"):
                    head = st.get_tensor(key)
    if embed is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=dtype)
        embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    if head is None:  # tie_word_embeddings
        head = embed
    return embed.to(device=device, dtype=dtype), head.to(device=device, dtype=dtype)


def load_drafter(checkpoint_dir, device="cpu") -> DFlashDrafter:
    """A drafter from a checkpoint directory alone (drafter.safetensors + config.json)."""
    from safetensors.torch import load_file

    d = Path(checkpoint_dir)
    cfg = DrafterConfig.from_dict(json.loads((d / "config.json").read_text()))
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(load_file(str(d / "drafter.safetensors"), device=str(device)))
    return drafter.to(device).eval()

