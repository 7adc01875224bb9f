"""DFlash 2's candidate logits: the frozen LM head's rows at each row's top-k ids, dotted with the
row's hidden state, without gathering those rows into memory.

    out[r, k] = sum_h hidden[r, h] * head[ids[r, k], h]        (fp32 accumulation, fp32 out)
    dhidden[r, h] = sum_k dout[r, k] * head[ids[r, k], h]      (the head is frozen: no gradient)

Why a kernel: the torch version (flashfleet_trainer.dflash2._CandidateLogits, the CPU path and this
kernel's test oracle) gathers head[ids] into an [R, K, H] tensor and multiplies it in a batched GEMM,
in the forward and again in the backward; at the Qwen3.6-27B drafter shape that tensor is 1.2 GB a
step, written and read twice. Here each program reads the head rows it needs straight from the head
(repeated ids hit the cache) and keeps only [R, K] and [R, H].
CUDA tensors (CPU ones under TRITON_INTERPRET=1, as the tests run it without a GPU).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# A program's rows and hidden channels per step, and its warps (forward and backward alike).
ROWS, CHANNELS, WARPS = 8, 64, 4


@triton.jit
def _forward_kernel(h_ptr, head_ptr, ids_ptr, out_ptr, r_total, hidden, k_total,
                    ROWS: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    k = tl.arange(0, KP)
    in_rk = (r < r_total)[:, None] & (k < k_total)[None, :]
    ids = tl.load(ids_ptr + r[:, None] * k_total + k[None, :], mask=in_rk, other=0)
    acc = tl.zeros((ROWS, KP), dtype=tl.float32)
    for h0 in range(0, hidden, CH):
        c = h0 + tl.arange(0, CH)
        in_c = c < hidden
        hv = tl.load(h_ptr + r[:, None] * hidden + c[None, :], mask=(r < r_total)[:, None] & in_c[None, :],
                     other=0.0).to(tl.float32)
        e = tl.load(head_ptr + ids[:, :, None] * hidden + c[None, None, :], mask=in_rk[:, :, None] & in_c[None, None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(e * hv[:, None, :], axis=2)
    tl.store(out_ptr + r[:, None] * k_total + k[None, :], acc, mask=in_rk)


@triton.jit
def _backward_kernel(g_ptr, head_ptr, ids_ptr, dh_ptr, r_total, hidden, k_total,
                     ROWS: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    k = tl.arange(0, KP)
    c = tl.program_id(1) * CH + tl.arange(0, CH)
    in_rk = (r < r_total)[:, None] & (k < k_total)[None, :]
    in_c = c < hidden
    ids = tl.load(ids_ptr + r[:, None] * k_total + k[None, :], mask=in_rk, other=0)
    g = tl.load(g_ptr + r[:, None] * k_total + k[None, :], mask=in_rk, other=0.0).to(tl.float32)
    e = tl.load(head_ptr + ids[:, :, None] * hidden + c[None, None, :], mask=in_rk[:, :, None] & in_c[None, None, :],
                other=0.0).to(tl.float32)
    dh = tl.sum(e * g[:, :, None], axis=1)
    tl.store(dh_ptr + r[:, None] * hidden + c[None, :], dh.to(dh_ptr.dtype.element_ty),
             mask=(r < r_total)[:, None] & in_c[None, :])


class _CandidateLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, ids):
        h, ids = hidden.to(head.dtype).contiguous(), ids.contiguous()
        r_total, k_total = ids.shape
        out = torch.empty(r_total, k_total, dtype=torch.float32, device=hidden.device)
        if r_total:
            _forward_kernel[(triton.cdiv(r_total, ROWS),)](
                h, head, ids, out, r_total, head.shape[1], k_total, ROWS=ROWS,
                KP=triton.next_power_of_2(k_total), CH=CHANNELS, num_warps=WARPS)
        ctx.save_for_backward(head, ids)
        ctx.hidden_dtype = hidden.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        head, ids = ctx.saved_tensors
        r_total, k_total = ids.shape
        dh = torch.empty(r_total, head.shape[1], dtype=ctx.hidden_dtype, device=grad.device)
        if r_total:
            _backward_kernel[(triton.cdiv(r_total, ROWS), triton.cdiv(head.shape[1], CHANNELS))](
                grad.contiguous(), head, ids, dh, r_total, head.shape[1], k_total, ROWS=ROWS,
                KP=triton.next_power_of_2(k_total), CH=CHANNELS, num_warps=WARPS)
        return dh, None, None


def candidate_logits(hidden: torch.Tensor, head: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[R, K] fp32 logits hidden [R, H] @ head.T at ids [R, K] (int64), with gradient to hidden only:
    CUDA tensors (the module docstring); the head contiguous, every id below its row count (not
    checked: the selector takes them from the logits' top-k and the labels)."""
    runs_here = hidden.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if (not runs_here or hidden.dim() != 2 or ids.dim() != 2 or ids.shape[0] != hidden.shape[0]
            or head.shape[1] != hidden.shape[1] or not head.is_contiguous()):
        raise ValueError(f"candidate_logits takes CUDA tensors hidden [R, H], a contiguous head [V, H] and ids [R, K]; "
                         f"got {hidden.device} hidden {tuple(hidden.shape)}, head {tuple(head.shape)}, ids "
                         f"{tuple(ids.shape)}: keep CPU tensors on flashfleet_trainer.dflash2.candidate_logits")
    return _CandidateLogits.apply(hidden, head, ids)
