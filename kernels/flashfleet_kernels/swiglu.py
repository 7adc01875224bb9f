"""SwiGLU of a packed [gate | up] tensor: silu(gate) * up, forward and backward in one Triton kernel each.

The drafter's MLP computes gate and up in one GEMM (`flashfleet_trainer.drafter.project`), so they
arrive side by side in one [rows, 2I] tensor. This op reads both halves of a row where they lie and
writes their gradients into one [rows, 2I] tensor, which is what that GEMM's backward takes: no
strided halves, no copy gathering two gradients into one. The math runs in fp32 and is rounded once;
the backward recomputes silu(gate) instead of keeping it.

With s = sigmoid(g): out = g * s * u; d/du = g * s; d/dg = u * s * (1 + g * (1 - s)).
CUDA tensors (CPU ones under TRITON_INTERPRET=1, as the tests run it without a GPU); the torch
version (the trainer's CPU path, and the oracle of tests/kernels/test_swiglu.py) is
`flashfleet_trainer.drafter.swiglu`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_BLOCK = 1024  # columns a program handles; a row of the 8B drafter's MLP (12,288) is 12 programs


@triton.jit
def _forward_kernel(gu_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < n_cols
    g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=keep).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=keep).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _backward_kernel(gu_ptr, dout_ptr, dgu_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < n_cols
    g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=keep).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=keep).to(tl.float32)
    dout = tl.load(dout_ptr + row * n_cols + cols, mask=keep).to(tl.float32)
    s = tl.sigmoid(g)
    dg = dout * u * s * (1 + g * (1 - s))
    du = dout * g * s
    ty = dgu_ptr.dtype.element_ty
    tl.store(dgu_ptr + row * 2 * n_cols + cols, dg.to(ty), mask=keep)
    tl.store(dgu_ptr + row * 2 * n_cols + n_cols + cols, du.to(ty), mask=keep)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        gu = gate_up.contiguous()
        rows, n = gu.numel() // gu.shape[-1], gu.shape[-1] // 2
        out = gu.new_empty(*gu.shape[:-1], n)
        if rows:
            _forward_kernel[(rows, triton.cdiv(n, _BLOCK))](gu, out, n, BLOCK=_BLOCK)
        ctx.save_for_backward(gu)
        return out

    @staticmethod
    def backward(ctx, dout):
        (gu,) = ctx.saved_tensors
        dout = dout.contiguous()
        rows, n = gu.numel() // gu.shape[-1], gu.shape[-1] // 2
        dgu = torch.empty_like(gu)
        if rows:
            _backward_kernel[(rows, triton.cdiv(n, _BLOCK))](gu, dout, dgu, n, BLOCK=_BLOCK)
        return dgu


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a CUDA tensor gate_up = [gate | up] (last dimension even). Output:
    gate_up's dtype, last dimension halved."""
    runs_here = gate_up.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if not runs_here or gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu takes a CUDA tensor of [gate | up] side by side, got {gate_up.device} "
                         f"{tuple(gate_up.shape)}: keep a CPU tensor on the torch version, and pass the gate "
                         "and up projections' outputs concatenated (an even last dimension)")
    return _SwiGLU.apply(gate_up)
