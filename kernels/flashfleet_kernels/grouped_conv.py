"""DFlash 2's grouped dynamic causal convolution: forward and backward in one Triton kernel each.

    y[r, c] = sum_t (base[t, c] + delta[r, t, g(c)]) * x[r - t, c]    for taps t <= r % block_size

x and y [M, H] are whole blocks laid out one after another; delta [M, taps, G] is shared by the
group_size channels of group g(c) = c // group_size; base [taps, H]. A tap never reaches into the
previous block. The math runs in fp32 and y is rounded once to x's dtype (vLLM's CUDA kernel does
the same); the backward gives x, delta and base their gradients:

    dx[r, c]        = sum_t dy[r + t, c] * (base[t, c] + delta[r + t, t, g(c)])   (tap t reaches r + t)
    ddelta[r, t, g] = sum_{c in g} dy[r, c] * x[r - t, c]
    dbase[t, c]     = sum_r dy[r, c] * x[r - t, c]

dbase sums over every row: each backward program writes its rows' fp32 partial sum, and torch adds
the partials (no atomics, so the result does not depend on the order programs run in).

Why a kernel: compiled by inductor, the convolution's pad, mask and broadcasts and its backward's
two reductions took about 43 ms of the DFlash 2 step at the Qwen3.6-27B drafter shape (one H100,
docs/benchmarks.md), where the tensors it reads and writes take well under 5 ms to move.
CUDA tensors (CPU ones under TRITON_INTERPRET=1, as the tests run it without a GPU); the torch
version, the trainer's CPU path and this kernel's test oracle, is
`flashfleet_trainer.dflash2.grouped_conv`.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

# A program's tile per direction: rows x channels (whole groups: channels % group_size == 0) and its
# warps; the backward's program takes `loop` such tiles in turn, so it writes one partial sum of the
# base gradient for loop x rows. The backward keeps five tiles live where the forward keeps two, so
# it takes fewer rows a tile (tests/benchmarks/bench_grouped_conv.py times the choices;
# docs/benchmarks.md).
FORWARD = {"rows": 32, "cols": 256, "warps": 4}
BACKWARD = {"rows": 16, "cols": 256, "warps": 4, "loop": 8, "stages": 1}  # stages: Triton's pipelining


@triton.jit
def _tile(row0, m, block_size, ROWS: tl.constexpr, NG: tl.constexpr, GS: tl.constexpr):
    """The tile from row row0 (int64; the pointers are advanced by it once, so the per-element
    offsets stay int32): local rows, block positions and whether each row is in range, this
    program's groups and their channels [NG, GS]."""
    r = tl.arange(0, ROWS)
    pos = ((row0 % block_size).to(tl.int32) + r) % block_size
    in_r = r < m - row0
    g = tl.program_id(1) * NG + tl.arange(0, NG)
    c = g[:, None] * GS + tl.arange(0, GS)[None, :]
    return r, pos, in_r, g, c


@triton.jit
def _forward_kernel(x_ptr, delta_ptr, base_ptr, y_ptr, m, h, groups, d_row, d_tap, block_size,
                    TAPS: tl.constexpr, GS: tl.constexpr, ROWS: tl.constexpr, NG: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    r, pos, in_r, g, c = _tile(row0, m, block_size, ROWS, NG, GS)
    in_g = g < groups
    off = r[:, None, None] * h + c[None, :, :]  # [ROWS, NG, GS] within the tile's first row
    xb, db = x_ptr + row0 * h, delta_ptr + row0 * d_row
    acc = tl.zeros((ROWS, NG, GS), dtype=tl.float32)
    for t in tl.static_range(TAPS):
        reach = in_r & (pos >= t)  # tap t stays inside the block
        xv = tl.load(xb + off - t * h, mask=reach[:, None, None] & in_g[None, :, None], other=0.0).to(tl.float32)
        b = tl.load(base_ptr + t * h + c, mask=in_g[:, None], other=0.0).to(tl.float32)
        d = tl.load(db + r[:, None] * d_row + t * d_tap + g[None, :], mask=reach[:, None] & in_g[None, :],
                    other=0.0).to(tl.float32)
        acc += (b[None, :, :] + d[:, :, None]) * xv
    tl.store(y_ptr + row0 * h + off, acc.to(y_ptr.dtype.element_ty), mask=in_r[:, None, None] & in_g[None, :, None])


@triton.jit
def _backward_kernel(x_ptr, delta_ptr, base_ptr, dy_ptr, dx_ptr, ddelta_ptr, dbase_ptr, m, h, groups, d_row,
                     d_tap, block_size, TAPS: tl.constexpr, TP: tl.constexpr, GS: tl.constexpr,
                     ROWS: tl.constexpr, NG: tl.constexpr, LOOP: tl.constexpr, STAGES: tl.constexpr):
    """LOOP tiles of ROWS rows a program, one after another: the base gradient's partial sum stays
    in registers across them ([TP = taps rounded up to a power of two, NG, GS]) and is written once;
    STAGES > 1 lets Triton's pipeliner load a tile's rows while the one before computes."""
    tap = tl.arange(0, TP)
    dbase = tl.zeros((TP, NG, GS), dtype=tl.float32)
    for it in tl.range(LOOP, num_stages=STAGES):
        row0 = (tl.program_id(0).to(tl.int64) * LOOP + it) * ROWS
        r, pos, in_r, g, c = _tile(row0, m, block_size, ROWS, NG, GS)
        in_g = g < groups
        off = r[:, None, None] * h + c[None, :, :]
        xb, db, dyb = x_ptr + row0 * h, delta_ptr + row0 * d_row, dy_ptr + row0 * h
        dy = tl.load(dyb + off, mask=in_r[:, None, None] & in_g[None, :, None], other=0.0).to(tl.float32)
        dx = tl.zeros((ROWS, NG, GS), dtype=tl.float32)
        for t in tl.static_range(TAPS):
            b = tl.load(base_ptr + t * h + c, mask=in_g[:, None], other=0.0).to(tl.float32)
            # row r reaches row r + t through tap t when r + t is in range and in the same block
            fwd = (r + t < m - row0) & (((pos + t) % block_size) >= t)
            if t == 0:
                dy_t = dy  # tap 0 reaches the row itself
            else:
                dy_t = tl.load(dyb + off + t * h, mask=fwd[:, None, None] & in_g[None, :, None],
                               other=0.0).to(tl.float32)
            d_t = tl.load(db + (r + t)[:, None] * d_row + t * d_tap + g[None, :], mask=fwd[:, None] & in_g[None, :],
                          other=0.0).to(tl.float32)
            dx += dy_t * (b[None, :, :] + d_t[:, :, None])
            # this row's tap t read row r - t: the coefficients' gradients
            back = in_r & (pos >= t)
            xv = tl.load(xb + off - t * h, mask=back[:, None, None] & in_g[None, :, None], other=0.0).to(tl.float32)
            prod = dy * xv
            tl.store(ddelta_ptr + (row0 + r)[:, None] * (TAPS * groups) + t * groups + g[None, :],
                     tl.sum(prod, axis=2).to(ddelta_ptr.dtype.element_ty), mask=in_r[:, None] & in_g[None, :])
            dbase += tl.where(tap[:, None, None] == t, tl.sum(prod, axis=0)[None, :, :], 0.0)
        tl.store(dx_ptr + row0 * h + off, dx.to(dx_ptr.dtype.element_ty),
                 mask=in_r[:, None, None] & in_g[None, :, None])
    g = tl.program_id(1) * NG + tl.arange(0, NG)
    c = g[:, None] * GS + tl.arange(0, GS)[None, :]
    tl.store(dbase_ptr + (tl.program_id(0) * TAPS + tap[:, None, None]) * h + c[None, :, :], dbase,
             mask=(tap[:, None, None] < TAPS) & (g < groups)[None, :, None])


def _delta_strides(delta):
    if delta.stride(-1) != 1:
        raise ValueError("delta's groups must be contiguous (its last stride 1)")
    return delta.stride(0), delta.stride(1)


class _GroupedConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, delta, base, block_size):
        x = x.contiguous()
        m, h = x.shape
        taps, groups = delta.shape[1], delta.shape[2]
        y = torch.empty_like(x)
        if m:
            gs, tile = h // groups, FORWARD
            _forward_kernel[(triton.cdiv(m, tile["rows"]), triton.cdiv(groups, tile["cols"] // gs))](
                x, delta, base, y, m, h, groups, *_delta_strides(delta), block_size, TAPS=taps, GS=gs,
                ROWS=tile["rows"], NG=tile["cols"] // gs, num_warps=tile["warps"])
        ctx.save_for_backward(x, delta, base)
        ctx.block_size = block_size
        return y

    @staticmethod
    def backward(ctx, dy):
        x, delta, base = ctx.saved_tensors
        dy = dy.contiguous()
        m, h = x.shape
        taps, groups = delta.shape[1], delta.shape[2]
        dx = torch.empty_like(x)
        ddelta = torch.empty(m, taps, groups, dtype=delta.dtype, device=x.device)
        tile = BACKWARD
        n_rb = triton.cdiv(m, tile["rows"] * tile["loop"])
        partial = torch.empty(n_rb, taps, h, dtype=torch.float32, device=x.device)
        if m:
            gs = h // groups
            _backward_kernel[(n_rb, triton.cdiv(groups, tile["cols"] // gs))](
                x, delta, base, dy, dx, ddelta, partial, m, h, groups, *_delta_strides(delta), ctx.block_size,
                TAPS=taps, TP=triton.next_power_of_2(taps), GS=gs, ROWS=tile["rows"], NG=tile["cols"] // gs,
                LOOP=tile["loop"], STAGES=tile["stages"], num_warps=tile["warps"])
        return dx, ddelta, partial.sum(0).to(base.dtype), None


def takes_shape(hidden_size: int, groups: int) -> bool:
    """Whether the kernel takes this many groups of a hidden size: equal groups that tile both
    directions' programs (group sizes dividing 256 with the tiles above; the published 16 does)."""
    gs = hidden_size // groups
    return hidden_size % groups == 0 and all(tile["cols"] % gs == 0 for tile in (FORWARD, BACKWARD))


def grouped_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """y [M, H] for CUDA tensors x [M, H], delta [M, taps, G] (groups contiguous; a view of a wider
    projection is fine), base [taps, H]: the module docstring's convolution, in x's dtype."""
    runs_here = x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    m, h = x.shape
    taps, groups = delta.shape[-2], delta.shape[-1]
    if not runs_here or not takes_shape(h, groups) or delta.shape[0] != m or base.shape != (taps, h):
        raise ValueError(f"grouped_conv takes CUDA tensors x [M, H], delta [M, taps, G] and base [taps, H] with "
                         f"G dividing H in groups whose size divides {math.gcd(FORWARD['cols'], BACKWARD['cols'])}; got {x.device} "
                         f"x {tuple(x.shape)}, delta {tuple(delta.shape)}, base {tuple(base.shape)}: keep CPU "
                         "tensors and other shapes on the torch version (flashfleet_trainer.dflash2.grouped_conv)")
    return _GroupedConv.apply(x, delta, base, block_size)
