"""The drafter's attention masks: the dense reference and flex_attention's tile-sparse BlockMask.

Attention has two implementations of the same mask (`attn_impl`): "dense", the reference, runs
SDPA with the boolean mask `[rows x (context + rows)]` that `block_attention_inputs` builds (CPU,
and every CUDA run that asks for it); "flex" runs torch's flex_attention, compiled, with a BlockMask
that lists only the 128 x 128 tiles a block row can see (its sequence's context before its anchor,
its own block), so the other ~85% of the score tiles are never computed. "auto" picks flex on
CUDA, dense elsewhere. Each draft layer is `full_attention` or `sliding_attention`
(`DrafterConfig.layer_types`, `sliding_window` W), with the semantics vLLM, SGLang and SpecForge
serve: a full layer's row sees its sequence's context before its anchor and its whole block; a
sliding layer's row at absolute position p sees keys k <= p with p - k < W (the query counts),
over context and block alike, so it is causal inside the block; DFlash 2's sliding layers are
not causal inside the block (`DrafterConfig.sliding_window_non_causal`: speculators' name, the
format's `is_causal: false`): the window cuts both ways, |p - k| < W, as z-lab's dflash 0.1.0 reads
that flag, so a block no longer than W is seen whole (speculators shows the whole block at any W).
Each kind is still two kv intervals per row, so the dense reference and the flex BlockMask are
built per kind.
"""

import torch
import torch.nn.functional as F

from .compilation import raise_recompile_limit


def block_attention_inputs(seq, anchor, block_size, sliding_window=None, causal=True):
    """Context gather indices and the strict DFlash mask for N blocks of one micro-batch (the dense
    reference).

    seq [N], anchor [N]: each block's sequence (in the micro-batch) and anchor position.
    Only context a block can see is gathered: positions < (last anchor) of sequences that have
    blocks. Returns (ctx_seq [T], ctx_pos [T], block_pos [N*B], mask [N*B, T+N*B]) where a block
    row sees context of ITS sequence strictly before ITS anchor (kv < anchor), its own block
    bidirectionally, and nothing else (a full_attention layer). With `sliding_window` W the mask is
    a sliding_attention layer's: of those, a row at absolute position p sees only keys at positions
    k <= p with p - k < W (the query itself counts), context and block alike: causal in the block;
    with `causal` False the block's keys only need |p - k| < W (DFlash 2's sliding layers).
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
        sees_block = sees_block & (back < w) & ((back >= 0) if causal else (back > -w))
    return ctx_seq, ctx_pos, block_pos, torch.cat([sees_ctx, sees_block], dim=1)


def layer_windows(cfg) -> dict:
    """{layer type used by the drafter: the mask's keyword arguments (`sliding_window`, None for
    full_attention, and `causal`)} for block_attention_inputs and block_mask_intervals."""
    causal = not getattr(cfg, "sliding_window_non_causal", False)
    return {t: dict(sliding_window=cfg.sliding_window if t == "sliding_attention" else None, causal=causal)
            for t in dict.fromkeys(cfg.layer_types)}


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


def block_mask_intervals(seq, anchor, block_size, sliding_window=None, causal=True):
    """The flex layout of a micro-batch: the strict DFlash mask as two kv intervals per row.

    The context is gathered like `block_attention_inputs` does (for each sequence in ascending
    order, positions 0..last anchor-1), so row r of block j (sequence s, anchor a) sees the kv
    interval [start_s, start_s + a) of the context (its sequence, positions < a) and the interval
    of its own block. The block rows start at t_pad, the context length rounded up to a tile,
    so each block lies inside one kv tile. Computed on the CPU (N entries). With `sliding_window`
    W (a sliding_attention layer) both intervals are cut to the window of the row's position
    p = a + k: context [start_s + max(0, p - W + 1), start_s + a), block slots
    [max(0, k - W + 1), k] ([max(0, k - W + 1), min(B, k + W)) with `causal` False); still two
    intervals.

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
        bhi[:m] = blo[:m] + (slot + 1 if causal else (slot + w).clamp(max=block_size)).int()
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
            raise_recompile_limit()  # one entry per (q_len, kv_len) bucket pair
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
    return {t: block_mask_intervals(blocks.seq, blocks.anchor, b, **w) for t, w in layer_windows(cfg).items()}
