"""Per-head RMSNorm and RoPE of projected rows, written straight into the attention's padded layout.

The drafter's flex attention takes q [heads, q_len, d] and k, v [kv heads, kv_len, d] with the
rows at fixed places: the context at [0, t), the block rows from a tile boundary t_pad on, zeros in
between and after (`flashfleet_trainer.attention.SparseAttention`). Done op by op, each projection's
output went through a norm kernel, a RoPE kernel on a transposed view, and a copy into the padded
layout, each with a backward of its own. Here one kernel reads a row of every head where the
projection wrote it ([rows, heads, d], a row's heads side by side), normalizes the first `normed`
heads (RMSNorm over d, times the weight) and rotates them (RoPE, halves layout), copies the other
heads as they are (V beside K in one projection), and writes each row at its place; one kernel
does the backward. The output is stored row-major ([length, heads, d]) and returned as [heads,
length, d] views: flex attention writes its output in q's stride order, so the attention output is
then [rows, heads * d] for the output projection without a copy.

Row r of x lands at output row r for r < split and at r + shift after it; the output rows no source
row reaches are zero. With n = x * rsqrt(mean(x^2) + eps) * w and y = n * cos + rot(n) * sin,
rot(n) = [-n2, n1] (Qwen3's RoPE): the backward is dn = dy * cos - rot(dy * sin), dw = sum dn * n/w
over rows and heads, dx = rstd * (dn * w - n_hat * mean(dn * w * n_hat)), n_hat = x * rstd.
fp32 math, rounded once. CUDA tensors (CPU ones under TRITON_INTERPRET=1); the torch oracle is
tests/kernels/test_norm_rope.py's.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_BLOCK_R = 16  # rows a program handles, of one head
_NUM_WARPS = 4


@triton.jit
def _forward_kernel(x_ptr, sx_r, sx_h, w_ptr, cos_ptr, sin_ptr, out_ptr, so_h, so_l,
                    n_rows, length, split, shift, normed, eps, D: tl.constexpr, BLOCK_R: tl.constexpr):
    h = tl.program_id(1)
    o = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # output rows
    src = tl.where(o < split, o, o - shift)
    valid = (o < length) & ((o < split) | (o >= split + shift)) & (src < n_rows)
    src = tl.where(valid, src, 0).to(tl.int64)
    cols = tl.arange(0, D)
    x_row = x_ptr + src[:, None] * sx_r + h * sx_h
    x = tl.load(x_row + cols[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    if h < normed:
        partner = (cols + D // 2) % D
        xp = tl.load(x_row + partner[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        a = x * rstd[:, None] * tl.load(w_ptr + cols).to(tl.float32)[None, :]
        ap = xp * rstd[:, None] * tl.load(w_ptr + partner).to(tl.float32)[None, :]
        c = tl.load(cos_ptr + src[:, None] * D + cols[None, :], mask=valid[:, None], other=0.0)
        s = tl.load(sin_ptr + src[:, None] * D + cols[None, :], mask=valid[:, None], other=0.0)
        sign = tl.where(cols < D // 2, -1.0, 1.0)
        y = a * c + sign[None, :] * ap * s
    else:
        y = x
    out = out_ptr + h * so_h + o.to(tl.int64)[:, None] * so_l + cols[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=(o < length)[:, None])


@triton.jit
def _backward_kernel(x_ptr, sx_r, sx_h, w_ptr, cos_ptr, sin_ptr, dya_ptr, sa_h, sa_l, dyb_ptr, sb_h, sb_l, n_a,
                     dx_ptr, sdx_r, sdx_h, dw_ptr, n_rows, split, shift, normed, eps,
                     D: tl.constexpr, BLOCK_R: tl.constexpr):
    h = tl.program_id(1)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # source rows
    keep = r < n_rows
    dest = tl.where(r < split, r, r + shift).to(tl.int64)
    r64 = tl.where(keep, r, 0).to(tl.int64)
    cols = tl.arange(0, D)
    partner = (cols + D // 2) % D
    if h < n_a:  # the gradient of the first output part, or of the second
        dy_row = dya_ptr + h * sa_h + dest[:, None] * sa_l
    else:
        dy_row = dyb_ptr + (h - n_a) * sb_h + dest[:, None] * sb_l
    dy = tl.load(dy_row + cols[None, :], mask=keep[:, None], other=0.0).to(tl.float32)
    if h < normed:
        dyp = tl.load(dy_row + partner[None, :], mask=keep[:, None], other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + r64[:, None] * D + cols[None, :], mask=keep[:, None], other=0.0)
        sp = tl.load(sin_ptr + r64[:, None] * D + partner[None, :], mask=keep[:, None], other=0.0)
        sign = tl.where(cols < D // 2, 1.0, -1.0)
        dn = dy * c + sign[None, :] * dyp * sp  # through the rotation: its transpose
        x = tl.load(x_ptr + r64[:, None] * sx_r + h * sx_h + cols[None, :], mask=keep[:, None], other=0.0)
        x = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        n_hat = x * rstd[:, None]
        tl.store(dw_ptr + (tl.program_id(0) * normed + h) * D + cols, tl.sum(dn * n_hat, axis=0))
        g = dn * tl.load(w_ptr + cols).to(tl.float32)[None, :]
        dx = rstd[:, None] * (g - n_hat * (tl.sum(g * n_hat, axis=1) / D)[:, None])
    else:
        dx = dy
    tl.store(dx_ptr + r64[:, None] * sdx_r + h * sdx_h + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=keep[:, None])


def takes_head_dim(d: int) -> bool:
    """Whether the kernels take heads of d: a power of 2 (a tile's width), at least 16."""
    return d >= 16 and not d & (d - 1)


class _NormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, cos, sin, eps, parts, normed, length, split, shift):
        n_rows, heads, d = x.shape
        out = x.new_empty(length, heads, d)  # row-major; returned as [heads, length, d] views
        grid = (triton.cdiv(length, _BLOCK_R), heads)
        if length:
            _forward_kernel[grid](x, x.stride(0), x.stride(1), weight, cos, sin, out, out.stride(1), out.stride(0),
                                  n_rows, length, split, shift, normed, eps, D=d, BLOCK_R=_BLOCK_R, num_warps=_NUM_WARPS)
        ctx.save_for_backward(x, weight, cos, sin)
        ctx.args = (eps, parts, normed, length, split, shift)
        return tuple(out.transpose(0, 1).split(parts))

    @staticmethod
    def backward(ctx, *douts):
        x, weight, cos, sin = ctx.saved_tensors
        eps, parts, normed, length, split, shift = ctx.args
        n_rows, heads, d = x.shape
        douts = [x.new_zeros(1, 1, d).expand(p, length, d) if g is None  # a part that got no gradient
                 else g if g.stride(2) == 1 else g.contiguous() for g, p in zip(douts, parts, strict=True)]
        a, b = douts[0], douts[-1]
        dx = torch.empty(n_rows, heads, d, dtype=x.dtype, device=x.device)
        blocks = triton.cdiv(n_rows, _BLOCK_R)
        dw = torch.empty(blocks, max(normed, 1), d, dtype=torch.float32, device=x.device)  # every slot written
        if n_rows:
            _backward_kernel[(blocks, heads)](x, x.stride(0), x.stride(1), weight, cos, sin,
                                              a, a.stride(0), a.stride(1), b, b.stride(0), b.stride(1), parts[0],
                                              dx, dx.stride(0), dx.stride(1), dw, n_rows, split, shift, normed, eps,
                                              D=d, BLOCK_R=_BLOCK_R, num_warps=_NUM_WARPS)
        dweight = dw.sum((0, 1)).to(weight.dtype) if normed else None  # no normed head: the weight is unused
        return dx, dweight, None, None, None, None, None, None, None, None


def norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, *,
              parts: tuple[int, ...], normed: int, length: int, split: int, shift: int = 0) -> tuple:
    """x [rows, heads, d] (a projection's output viewed per head; rows and heads may be strided, d
    contiguous); weight [d] the RMSNorm weight of the first `normed` heads; cos, sin [rows, d] fp32
    (Qwen3's RoPE, halves layout). Returns one tensor [p, length, d] per p in `parts` (one or two
    parts that split the heads: q; or K and V), in x's dtype: row r at r (r < split) or r + shift,
    zeros elsewhere. d: see `takes_head_dim`."""
    n_rows, heads, d = x.shape
    runs_here = x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    problems = []
    if not runs_here:
        problems.append(f"a CUDA tensor (got {x.device}; keep CPU tensors on the torch ops)")
    if not takes_head_dim(d) or x.stride(2) != 1:
        problems.append(f"a contiguous head dimension that is a power of 2, at least 16 (got {d}, stride "
                        f"{x.stride(2)})")
    if not 1 <= len(parts) <= 2 or sum(parts) != heads or not 0 <= normed <= heads:
        problems.append(f"one or two parts that split the {heads} heads, and at most that many normed (got "
                        f"{parts}, {normed})")
    if tuple(weight.shape) != (d,) or tuple(cos.shape) != (n_rows, d) or cos.shape != sin.shape:
        problems.append(f"a weight [{d}] and cos, sin [{n_rows}, {d}] (got {tuple(weight.shape)}, "
                        f"{tuple(cos.shape)}, {tuple(sin.shape)})")
    if not (0 <= split <= n_rows and shift >= 0 and length >= n_rows + shift):
        problems.append(f"0 <= split <= rows, shift >= 0 and length >= rows + shift (got split {split}, shift "
                        f"{shift}, length {length}, {n_rows} rows)")
    if problems:
        raise ValueError("norm_rope needs " + "; ".join(problems))
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    return _NormRope.apply(x, weight, cos, sin, float(eps), tuple(parts), normed, length, split, shift)
