"""Fused linear + CE + temperature-KL drafter loss: chunked cuBLAS matmuls and a Triton row kernel.

Why this shape of implementation (docs/kernels.md has the longer story):

* The loss needs three ``N x d x V`` matmuls (student logits, teacher logits, gradient to the
  student hidden states). At DFlash shapes they are ~90% of the ideal run time, so they stay in
  cuBLAS, which already runs them near peak; everything else must be cheap and must not store
  ``[N, V]``.
* Rows are processed in chunks of ``C`` rows. Per chunk, cuBLAS writes student and teacher logits
  into one fixed ``[2C, V]`` workspace; a Triton stats kernel (one program per row and vocabulary
  segment) makes one online pass over its segment that tracks the student softmax at T=1 (for CE),
  the student softmax at T and the teacher softmax at T (for KL) together, a finish kernel merges
  each row's segments, then a gradient kernel (again per row and segment) overwrites the student
  logits *in place* with the weighted gradient ``d loss / d z_s``; one more cuBLAS matmul turns
  that into the chunk's rows of ``d loss / d h_s``. The workspace is reused by the next chunk, so
  peak extra memory is the workspace plus the ``[N, d]`` gradient, independent of ``N`` otherwise.
* Because the gradient is complete after forward, backward only multiplies by the incoming scalar
  gradient. Per-row weights given as a tensor are normalised by their sum before the kernel runs,
  so the gradient written in forward is already the final one. Weights that depend on the rows'
  own CE (the drafter's streak weights) are given as a function instead: per chunk the stats and
  finish kernels give the CE (and KL, argmax, the softmax normalisers), the function turns the
  chunk's CE into its weights, and the gradient kernel then runs with the unnormalised weights; ``1 / sum w'`` then scales the gradient in backward. So the statistics
  and the weights cost no logits GEMM of their own.
* The chunk loop is :class:`ChunkLoop` (per chunk: ``logits``, ``rows``, ``grads``); the autograd
  Function runs it, and ``bench --breakdown`` runs the same object with timing marks in between,
  so the kernel is launched from one place only.
* Row offsets are int64 (``N * V`` exceeds 2^31 at N=16k, V=152k) and all softmax bookkeeping is
  fp32, whatever the logits' dtype.
* Option ``teacher_fp8`` (off by default): the teacher logits need no gradient and W is frozen, so
  their GEMM may run in FP8 (``torch._scaled_mm``, float8_e4m3fn, one scale per row of ``h_t`` and
  per vocabulary row of W, written in the head's dtype into the same workspace): less energy at
  the GPU's power limit. W is quantized once and cached (:func:`fp8_head`: ``V x d`` bytes kept
  beside the head, V padded to a multiple of 16); the student logits and the gradient GEMM are
  unchanged. What it costs in numerics, and whether it is worth it, is in docs/benchmarks.md.

Gradient with respect to the student logits of row i (``q_T = softmax(z_s / T)``,
``p = softmax(z_t / T)``, ``q_1 = softmax(z_s)``, ``s_i = w_i' / sum w'``)::

    g_i = s_i * ( a * T * (q_T - p) + (1 - a) * (q_1 - onehot(y_i)) )

(the ``T^2`` on the KL cancels one ``1/T`` from the chain rule, leaving ``a * T``).
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from .reference import check_labels_from_teacher, check_top_k

# Fixed workspace for the per-chunk logits. 768 MiB leaves room for the [N, d] gradient under the
# 1 GiB "extra memory" goal at N=16k, d=5120, bf16.
DEFAULT_WORKSPACE_BYTES = 768 * 1024 * 1024

# Row-kernel launch on a GPU: vocabulary columns per step, warps per program, columns per segment
# (each row is split into segments swept by programs of their own; see docs/kernels.md).
ROW_BLOCK, ROW_WARPS, ROW_SEGMENT = 2048, 4, 16384

# Student and teacher logits of a chunk as one M=2C GEMM (their rows copied into a [2C, d] staging
# buffer first) instead of two M=C GEMMs; see docs/kernels.md for the measurements.
ONE_LOGITS_GEMM = False

# Teacher logits from an FP8 GEMM (torch._scaled_mm, one float8_e4m3fn scale per row of h_t and per
# vocabulary row of W) instead of bf16: they need no gradient and W is frozen, so W is quantized once
# and cached (see fp8_head). Student logits and the gradient GEMM stay in the head's dtype. Off by
# default; docs/benchmarks.md has its time and numerics. Takes precedence over ONE_LOGITS_GEMM.
TEACHER_FP8 = False


# Vocabulary-tile skipping in the gradient GEMM (d loss / d h_s = g W). A (row block, vocabulary tile)
# pair is left out of that GEMM when its share of the gradient's L1 mass is small: per row block the
# tiles are taken cheapest first (cost = the largest share any of its rows has in the tile) while the
# costs sum to at most SKIP_MASS, so every row loses at most SKIP_MASS of the L1 mass of its
# gradient wrt the logits, and ||error of its d loss / d h_s|| <= SKIP_MASS * ||g_i||_1 * max_v ||W_v||.
# 2^-10 is below the relative rounding (2^-9) of the bf16 gradient the GEMM reads anyway.
SKIP_MASS = 2.0**-10
# Off by default: at T=2 with KL weight 0.7 (the drafter's loss) the KL term's gradient is spread over
# the vocabulary, so within the bound almost nothing can be skipped, and the per-chunk plan costs
# ~1.5 ms per 8192 rows; with sharp distributions (CE-heavy or T=1 losses on a peaked target) it
# skipped 94-98% of the pairs on an H200 (docs/benchmarks.md).
SKIP_TILES = False
# The skipping GEMM (Triton, ~460 TFLOP/s against cuBLAS's ~800 when it keeps everything) runs for a
# chunk only where at least this share of its (row block, tile) pairs can be skipped; otherwise cuBLAS
# runs the whole product (nothing skipped, nothing reported for that chunk).
SKIP_MIN_FRACTION = 0.5
# (rows per block, vocabulary columns per tile, output columns per program, warps, stages, K splits)
# of the skipping GEMM on a GPU.
SKIP_GEMM = (128, 64, 256, 8, 4, 4)

# Slots of one (row, vocabulary segment) partial: the stats kernel writes them, the finish kernel merges them.
# m_s, d_1, d_T, m_t, d_t, acc, argmax (as fp32, exact below 2^24), z_y (segment 0 only), and with the
# teacher's labels its argmax (fp32) and the student's logit there; the kernels take it as NPART
_NPART = 10


@triton.jit
def _row_stats_kernel(
    s_ptr,  # [rows, V] student logits
    t_ptr,  # [rows, V] teacher logits (unused when not HAS_KL)
    stride_s,
    stride_t,
    labels_ptr,  # [rows] int64
    part_ptr,  # [rows, n_seg, _NPART] fp32 out
    V,
    SEG,  # columns per segment (a multiple of BLOCK)
    inv_temp,
    ignore_index,
    HAS_KL: tl.constexpr,
    SEPARATE_T: tl.constexpr,  # T != 1: the student needs a second normaliser for the KL
    SQUARE_T: tl.constexpr,  # T == 2: exp(z - m) = exp((z - m) / 2)^2, one exp per student logit
    WRITE_ARGMAX: tl.constexpr,
    TEACHER_LABEL: tl.constexpr,  # the label is the teacher's argmax: track it and the student's logit there
    NPART: tl.constexpr,  # _NPART
    BLOCK: tl.constexpr,
):
    """Pass 1 on one vocabulary segment of one row: an online sweep that keeps, together, the student
    max and normalisers at T=1 and at T, the teacher max and normaliser at T and
    ``sum exp((z_t - m_t) / T) (z_t - z_s)``. Segments are merged by the finish kernel; splitting a
    row over several programs gives the GPU ``rows x segments`` independent sweeps to overlap."""
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    n_seg = tl.num_programs(1)
    s_row = s_ptr + row * stride_s
    t_row = t_ptr + row * stride_t
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, V)
    # One running max per side serves both temperatures because max(z / T) = max(z) / T for T > 0.
    m_s = float("-inf")
    d_1 = 0.0  # sum exp(z_s - m_s)
    d_T = 0.0  # sum exp((z_s - m_s) / T)
    m_t = float("-inf")
    d_t = 0.0  # sum exp((z_t - m_t) / T)
    acc = 0.0  # sum exp((z_t - m_t) / T) * (z_t - z_s)
    best = lo
    best_t = lo  # TEACHER_LABEL: the teacher's first argmax so far and the student's logit there
    s_at = 0.0
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < hi
        zs = tl.load(s_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        blk_max = tl.max(zs, axis=0)
        if WRITE_ARGMAX:
            best = tl.where(blk_max > m_s, start + tl.argmax(zs, axis=0), best)
        m_new = tl.maximum(m_s, blk_max)
        if SQUARE_T:
            half = tl.exp((m_s - m_new) * 0.5)
            e_T = tl.exp((zs - m_new) * 0.5)
            d_T = d_T * half + tl.sum(e_T, axis=0)
            d_1 = d_1 * (half * half) + tl.sum(e_T * e_T, axis=0)
        else:
            d_1 = d_1 * tl.exp(m_s - m_new) + tl.sum(tl.exp(zs - m_new), axis=0)
            if SEPARATE_T:
                d_T = d_T * tl.exp((m_s - m_new) * inv_temp) + tl.sum(tl.exp((zs - m_new) * inv_temp), axis=0)
        m_s = m_new
        if HAS_KL:
            zt = tl.load(t_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
            if TEACHER_LABEL:  # strictly greater: the first block holding the max keeps it (as one sweep)
                i_t = tl.argmax(zt, axis=0)
                take = tl.max(zt, axis=0) > m_t
                best_t = tl.where(take, start + i_t, best_t)
                s_at = tl.where(take, tl.sum(tl.where(tl.arange(0, BLOCK) == i_t, zs, 0.0), axis=0), s_at)
            mt_new = tl.maximum(m_t, tl.max(zt, axis=0))
            alpha = tl.exp((m_t - mt_new) * inv_temp)
            e_t = tl.exp((zt - mt_new) * inv_temp)
            d_t = d_t * alpha + tl.sum(e_t, axis=0)
            # Both sides are -inf in the masked tail: select before subtracting to avoid inf - inf.
            diff = tl.where(mask, zt, 0.0) - tl.where(mask, zs, 0.0)
            acc = acc * alpha + tl.sum(e_t * diff, axis=0)
            m_t = mt_new
    part = part_ptr + (row * n_seg + seg) * NPART
    tl.store(part, m_s)
    tl.store(part + 1, d_1)
    tl.store(part + 2, d_T)
    tl.store(part + 3, m_t)
    tl.store(part + 4, d_t)
    tl.store(part + 5, acc)
    tl.store(part + 6, best.to(tl.float32))
    if TEACHER_LABEL:
        tl.store(part + 8, best_t.to(tl.float32))
        tl.store(part + 9, s_at)
    if seg == 0:  # the label's logit, read here because the gradient kernel overwrites the logits
        label = tl.load(labels_ptr + row)
        valid = (label != ignore_index) & (label >= 0) & (label < V)
        tl.store(part + 7, tl.load(s_row + label, mask=valid, other=0.0).to(tl.float32))


@triton.jit
def _row_finish_kernel(
    part_ptr,  # [rows, n_seg, _NPART] fp32 from the stats kernel
    n_seg,
    labels_ptr,  # [rows] int64; with TEACHER_LABEL each valid row's label is overwritten with the teacher's argmax
    ce_ptr,  # [rows] fp32 out: CE(z_s, y) (0 for ignored labels)
    kl_ptr,  # [rows] fp32 out: T^2 * KL(p || q_T)
    argmax_ptr,  # [rows] int32 out: argmax z_s (only when WRITE_ARGMAX)
    norm_ptr,  # [rows, 5] fp32 out: m_s, log d_1, log d_T, m_t, log d_t for the gradient kernel
    V,
    inv_temp,
    ignore_index,
    HAS_KL: tl.constexpr,
    SEPARATE_T: tl.constexpr,
    WRITE_ARGMAX: tl.constexpr,
    TEACHER_LABEL: tl.constexpr,
    NPART: tl.constexpr,  # _NPART
    SEG_P2: tl.constexpr,  # next power of two >= n_seg
):
    """Merges a row's segment partials into its CE, KL, argmax and softmax normalisers."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, SEG_P2)
    have = i < n_seg
    row_part = part_ptr + row * n_seg * NPART  # this row's first partial
    part = row_part + i * NPART
    ms_i = tl.load(part, mask=have, other=float("-inf"))
    m_s = tl.max(ms_i, axis=0)
    d_1 = tl.sum(tl.load(part + 1, mask=have, other=0.0) * tl.exp(ms_i - m_s), axis=0)
    log_d1 = tl.log(d_1)
    if SEPARATE_T:
        log_dT = tl.log(tl.sum(tl.load(part + 2, mask=have, other=0.0) * tl.exp((ms_i - m_s) * inv_temp), axis=0))
    else:
        log_dT = log_d1
    label = tl.load(labels_ptr + row)
    valid = (label != ignore_index) & (label >= 0) & (label < V)
    z_y = tl.load(row_part + 7)
    if TEACHER_LABEL:  # the first segment holding the teacher's max gives the label and its student logit
        t_seg = tl.argmax(tl.load(part + 3, mask=have, other=float("-inf")), axis=0)
        valid = label != ignore_index
        label = tl.load(row_part + t_seg * NPART + 8).to(tl.int64)
        z_y = tl.load(row_part + t_seg * NPART + 9)
        tl.store(labels_ptr + row, label, mask=valid)
    tl.store(ce_ptr + row, tl.where(valid, m_s + log_d1 - z_y, 0.0))
    if WRITE_ARGMAX:  # the first segment holding the max; within it, the first column (as one sweep)
        seg = tl.argmax(ms_i, axis=0)
        tl.store(argmax_ptr + row, tl.load(row_part + seg * NPART + 6).to(tl.int32))
    m_t = 0.0
    log_dt = 0.0
    if HAS_KL:
        mt_i = tl.load(part + 3, mask=have, other=float("-inf"))
        m_t = tl.max(mt_i, axis=0)
        rescale = tl.exp((mt_i - m_t) * inv_temp)
        d_t = tl.sum(tl.load(part + 4, mask=have, other=0.0) * rescale, axis=0)
        acc = tl.sum(tl.load(part + 5, mask=have, other=0.0) * rescale, axis=0)
        log_dt = tl.log(d_t)
        # KL = sum p (log p - log q_T) = E_p[(z_t - z_s) / T] - lse(z_t / T) + lse(z_s / T)
        kl = (acc / d_t) * inv_temp - (m_t * inv_temp + log_dt) + (m_s * inv_temp + log_dT)
        tl.store(kl_ptr + row, kl / (inv_temp * inv_temp))
    norm = norm_ptr + row * 5
    tl.store(norm, m_s)
    tl.store(norm + 1, log_d1)
    tl.store(norm + 2, log_dT)
    tl.store(norm + 3, m_t)
    tl.store(norm + 4, log_dt)


@triton.jit
def _row_grad_kernel(
    s_ptr,  # [rows, V] student logits; overwritten with d loss / d logits
    t_ptr,
    stride_s,
    stride_t,
    labels_ptr,
    scale_ptr,  # [rows] fp32: the row's weight factor, 0 for rows that drop out
    norm_ptr,  # [rows, 5] fp32 from the finish kernel
    V,
    SEG,
    inv_temp,
    ce_coef,  # 1 - a
    kl_coef,  # a * T
    mass_ptr,  # [rows, n_tiles] fp32 out (only when WRITE_MASS): sum of |gradient| per TILE columns
    n_tiles,
    HAS_KL: tl.constexpr,
    HAS_CE: tl.constexpr,
    SEPARATE_T: tl.constexpr,
    SQUARE_T: tl.constexpr,
    BLOCK: tl.constexpr,
    WRITE_MASS: tl.constexpr,
    TILE: tl.constexpr,  # vocabulary columns per skip tile (divides BLOCK)
):
    """Pass 2 on one segment: overwrite the student logits with the weighted gradient (and, for tile
    skipping, write the L1 mass of the gradient in each TILE-column tile of the row)."""
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    s_row = s_ptr + row * stride_s
    t_row = t_ptr + row * stride_t
    label = tl.load(labels_ptr + row)
    scale = tl.load(scale_ptr + row)
    norm = norm_ptr + row * 5
    m_s = tl.load(norm)
    log_d1 = tl.load(norm + 1)
    log_dT = tl.load(norm + 2)
    m_t = tl.load(norm + 3)
    log_dt = tl.load(norm + 4)
    inv_d1 = tl.exp(-log_d1)
    inv_dT = tl.exp(-log_dT)
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, V)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < hi
        zs = tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float32)
        if SQUARE_T:
            e_T = tl.exp((zs - m_s) * 0.5)
            q_T = e_T * inv_dT
            q1 = e_T * e_T * inv_d1
        elif SEPARATE_T:
            q_T = tl.exp((zs - m_s) * inv_temp - log_dT)
            q1 = tl.exp(zs - m_s - log_d1)
        else:
            q1 = tl.exp(zs - m_s - log_d1)
            q_T = q1
        g = tl.zeros([BLOCK], dtype=tl.float32)
        if HAS_CE:
            g = ce_coef * tl.where(offs == label, q1 - 1.0, q1)
        if HAS_KL:
            zt = tl.load(t_row + offs, mask=mask, other=0.0).to(tl.float32)
            p = tl.exp((zt - m_t) * inv_temp - log_dt)
            g += kl_coef * (q_T - p)
        g = g * scale
        tl.store(s_row + offs, g.to(s_ptr.dtype.element_ty), mask=mask)
        if WRITE_MASS:
            a = tl.where(mask, tl.abs(g), 0.0)
            tile_mass = tl.sum(tl.reshape(a, [BLOCK // TILE, TILE]), axis=1)
            t_offs = start // TILE + tl.arange(0, BLOCK // TILE)
            tl.store(mass_ptr + row * n_tiles + t_offs, tile_mass, mask=t_offs < n_tiles)


@triton.jit
def _skip_grad_gemm_kernel(
    g_ptr,  # [rows, V] gradient wrt the chunk's student logits (the workspace)
    w_ptr,  # [V, D] head
    part_ptr,  # [SPLIT, rows, D] fp32 out: partial sums of g @ W over the split's kept tiles
    idx_ptr,  # [row blocks, n_tiles] int32: each row block's kept vocabulary tiles first, ascending
    count_ptr,  # [row blocks] int32: how many tiles each row block keeps
    rows,
    V,
    D,
    stride_g,
    stride_w,
    n_tiles,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,  # rows per row block (the skip decision's granularity)
    BN: tl.constexpr,
    TILE: tl.constexpr,  # vocabulary columns per tile: the GEMM's K step
    IEEE: tl.constexpr,  # fp32 inputs: no TF32
):
    """``g @ W`` over the kept (row block, vocabulary tile) pairs only: split-K over each row block's
    list of kept tiles, one fp32 partial per split (summed by the caller, so the result does not
    depend on scheduling). Programs of one split run together, so they share W's and g's tiles in L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(rows, BM)
    num_n = tl.cdiv(D, BN)
    per_split = num_m * num_n
    s = pid // per_split
    r = pid % per_split
    pid_n = r // num_m
    pid_m = r % num_m
    count = tl.load(count_ptr + pid_m)
    lo = count * s // SPLIT
    hi = count * (s + 1) // SPLIT
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, TILE)
    m_ok = offs_m < rows
    n_ok = offs_n < D
    a_base = g_ptr + offs_m.to(tl.int64)[:, None] * stride_g + offs_k[None, :]
    b_base = w_ptr + offs_k.to(tl.int64)[:, None] * stride_w + offs_n[None, :]
    idx_row = idx_ptr + pid_m.to(tl.int64) * n_tiles
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i in range(lo, hi):
        k0 = tl.load(idx_row + i) * TILE
        k_ok = (k0 + offs_k) < V
        a = tl.load(a_base + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_base + k0.to(tl.int64) * stride_w, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    out = part_ptr + (s * rows + offs_m.to(tl.int64))[:, None] * D + offs_n[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _skip_grad_gemm_tma_kernel(
    g_desc,  # tensor descriptor of the [rows, V] gradient, blocks [BM, TILE]
    w_desc,  # tensor descriptor of the [V, D] head, blocks [TILE, BN]
    part_ptr,
    idx_ptr,
    count_ptr,
    rows,
    D,
    n_tiles,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    TILE: tl.constexpr,
):
    """:func:`_skip_grad_gemm_kernel` with the tiles loaded through tensor descriptors (TMA on Hopper;
    out-of-range rows and columns read as zeros). Timed by ``bench --skip-gemm``; not used by the loss."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(rows, BM)
    per_split = num_m * tl.cdiv(D, BN)
    s = pid // per_split
    r = pid % per_split
    pid_n = r // num_m
    pid_m = r % num_m
    count = tl.load(count_ptr + pid_m)
    lo = count * s // SPLIT
    hi = count * (s + 1) // SPLIT
    idx_row = idx_ptr + pid_m.to(tl.int64) * n_tiles
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i in range(lo, hi):
        k0 = tl.load(idx_row + i) * TILE
        a = g_desc.load([pid_m * BM, k0])
        b = w_desc.load([k0, pid_n * BN])
        acc = tl.dot(a, b, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    out = part_ptr + (s * rows + offs_m.to(tl.int64))[:, None] * D + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m < rows)[:, None] & (offs_n < D)[None, :])


_ROW_KERNELS = (_row_stats_kernel, _row_finish_kernel, _row_grad_kernel, _skip_grad_gemm_kernel)
_interpreted_kernels = None


def _row_kernels_for(device: torch.device):
    """The Triton kernels (stats, finish, grad, the skipping gradient GEMM), or interpreted copies of
    them for CPU tensors.

    Whether ``triton.jit`` compiles or interprets is decided when the module is imported, from
    ``TRITON_INTERPRET``. If this module was imported without it (e.g. by another test folder
    first) and is then asked to run on CPU tensors, build interpreted copies instead of failing.
    """
    global _interpreted_kernels
    if device.type != "cpu" or not isinstance(_ROW_KERNELS[0], triton.runtime.JITFunction):
        return _ROW_KERNELS
    if _interpreted_kernels is None:
        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError as exc:  # pragma: no cover - depends on the Triton build
            raise RuntimeError(
                "Triton cannot run on CPU tensors here: set TRITON_INTERPRET=1 before importing "
                "triton, or use impl='torch'"
            ) from exc
        _interpreted_kernels = tuple(InterpretedFunction(k.fn) for k in _ROW_KERNELS)
    return _interpreted_kernels


# Rows per chunk, largest first. Measured on an H200 (bf16, d=5120, whole forward+backward): cuBLAS
# runs these sizes well, while e.g. 640 and 1280 rows were 5-10% slower at both vocabularies.
_CHUNK_CANDIDATES = (2048, 1536, 1024, 768, 512, 384, 256, 128, 64, 32, 16, 8, 4, 2, 1)


TOPK_SEGMENT = 128  # columns per segment of top_k_ids' first pass
_SEGMENTS_PER_PROGRAM = 16


@triton.jit
def _segment_max_kernel(z_ptr, out_ptr, vocab, stride, n_seg, SEG: tl.constexpr, SB: tl.constexpr):
    """out[row, s] = max of z[row, s*SEG:(s+1)*SEG] (the last segment ragged), SB segments a program."""
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1) * SB + tl.arange(0, SB)
    cols = seg[:, None] * SEG + tl.arange(0, SEG)[None, :]
    vals = tl.load(z_ptr + row * stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    tl.store(out_ptr + row * n_seg + seg, tl.max(vals, axis=1), mask=seg < n_seg)


def top_k_ids(z: torch.Tensor, k: int, seg: int = TOPK_SEGMENT) -> torch.Tensor:
    """[rows, k] int64 ids of each row's k largest values of z [rows, V] (unit last stride), best
    first, in two cheap passes instead of one radix top-k over V: a segment holding one of a row's
    k largest values has its maximum among the row's k largest segment maxima, so the k segments of
    largest maxima hold all of them; a top-k over those k * seg columns then picks them. The
    maxima come from one Triton pass over z (torch's reduction over 128-column segments took 6 ms
    of the DFlash 2 step at V = 248,320 on one H100; the radix top-k of whole rows 17 ms). Ties
    may resolve differently from torch.topk; the values are the same."""
    n, v = z.shape
    n_seg = triton.cdiv(v, seg)
    if n_seg <= k:  # too few segments to gain anything
        return z.topk(k, dim=-1).indices
    maxima = torch.empty(n, n_seg, dtype=torch.float32, device=z.device)
    _segment_max_kernel[(n, triton.cdiv(n_seg, _SEGMENTS_PER_PROGRAM))](
        z, maxima, v, z.stride(0), n_seg, SEG=seg, SB=_SEGMENTS_PER_PROGRAM)
    cols = (maxima.topk(k, dim=-1).indices[:, :, None] * seg + torch.arange(seg, device=z.device)).reshape(n, -1)
    vals = z.gather(1, cols.clamp(max=v - 1)).masked_fill(cols >= v, float("-inf"))  # past the end: never picked
    return cols.gather(1, vals.topk(k, dim=-1).indices)


def default_chunk_size(n_rows: int, vocab: int, itemsize: int, has_kl: bool,
                       workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> int:
    """Rows per chunk: the largest well-performing size whose ``[rows, V]`` logits fit the budget.

    With the 768 MiB default and bf16 that is 1024 rows at V=151,936 and 768 at V=248,320
    (student + teacher logits); never more rows than there are.
    """
    per_row = vocab * itemsize * (2 if has_kl else 1)
    rows = next(c for c in _CHUNK_CANDIDATES if c * per_row <= workspace_bytes or c == 1)
    return max(1, min(rows, n_rows))


def _launch_config(vocab: int, device: torch.device) -> tuple[int, int, int]:
    """(columns per kernel step, warps, columns per segment) for the row kernels."""
    if device.type == "cpu":  # the interpreter: a few blocks per row exercise the online merge
        block = min(1024, triton.next_power_of_2(vocab))
        return block, 1, 2 * block
    block = min(ROW_BLOCK, triton.next_power_of_2(vocab))
    return block, ROW_WARPS, max(block, ROW_SEGMENT // block * block)


def skip_plan(mass: torch.Tensor, rows: int, block_rows: int, skip_mass: float, worth=None):
    """Which (row block, vocabulary tile) pairs the gradient GEMM leaves out, from per-row tile masses.

    ``mass [R, n_tiles]`` (R a multiple of ``block_rows``, rows past ``rows`` ignored) is the L1 mass of
    each row's gradient wrt the logits per tile. Per row block, tiles are sorted by their cost (the
    largest share ``mass / row total`` any row of the block has in them) and skipped cheapest first
    while the running sum of costs stays within ``skip_mass``: so each row's skipped share of its L1
    mass is at most ``skip_mass``. Returns ``(kept, count, row_skipped, row_total)``: ``kept [blocks,
    n_tiles]`` int32 (each block's kept tiles first, ascending, then the skipped ones), ``count
    [blocks]`` int32 (tiles kept), ``row_skipped [rows]`` fp32 (each row's skipped share of its L1
    mass) and ``row_total [rows]`` fp32 (each row's L1 mass). ``worth(skipped, pairs)``, if given, is
    asked (one host sync) before the lists are made; where it says no, the first three are None.
    """
    n_tiles = mass.shape[1]
    blocks = -(-rows // block_rows)
    mass = mass[: blocks * block_rows]
    if rows < mass.shape[0]:
        mass[rows:] = 0.0
    total = mass.sum(1, keepdim=True)
    share = (mass / total.clamp_min(torch.finfo(torch.float32).tiny)).view(blocks, block_rows, n_tiles)
    cost, order = share.amax(1).sort(1)
    n_skip = (cost.cumsum(1) <= skip_mass).sum(1, keepdim=True)
    row_total = total.reshape(-1)[:rows]
    if worth is not None and not worth(int(n_skip.sum()), n_skip.numel() * n_tiles):
        return None, None, None, row_total
    ranks = torch.arange(n_tiles, device=mass.device)
    skip = torch.empty_like(order, dtype=torch.bool).scatter_(1, order, ranks < n_skip)
    kept = torch.where(skip, ranks + n_tiles, ranks).sort(1).values.to(torch.int32)
    row_skipped = (share * skip[:, None, :]).sum(2).reshape(-1)[:rows]
    return kept, (n_tiles - n_skip.squeeze(1)).to(torch.int32), row_skipped, row_total


def normalised_scale(labels: torch.Tensor, row_weights: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """``w_i' / sum(w')`` per row for weights known up front (0 for rows that drop out, and all 0
    when no weight is left), so that the gradient written in forward is already the final one."""
    w_eff = torch.where(labels != ignore_index, row_weights.to(torch.float32), 0.0)
    total = w_eff.sum()
    return (w_eff / torch.where(total > 0, total, torch.ones_like(total))).contiguous()


# FP8 teacher logits (teacher_fp8): h_t per chunk and W once, one float8_e4m3fn scale per row.
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)  # None in a torch without float8 types
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
FP8_ALIGN = 16  # FP8 GEMMs (torch._scaled_mm) need every operand dimension a multiple of this
_FP8_HEAD_BLOCK = 4096  # head rows quantized at a time: bounds the fp32 temporaries (80 MiB at d=5120)
_fp8_support = {}  # (device, out dtype) -> None where the probe ran, else why it failed
_fp8_heads = {}  # at most one quantized head: key -> (weak reference to the head, its _version, w8, scale)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` with ``x ~= q * s``: ``x [R, K]`` as float8_e4m3fn, one fp32 scale per row (``s [R, 1]``).

    A row's largest magnitude maps to the format's largest value; an all-zero row gets the smallest
    normal fp32 as its scale rather than 0 (no 0 / 0)."""
    amax = x.abs().amax(dim=1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp_min_(torch.finfo(torch.float32).tiny)
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_teacher_logits(h_t: torch.Tensor, head8: tuple[torch.Tensor, torch.Tensor], vocab: int,
                       out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``h_t @ W^T`` (``[rows, vocab]``) from the FP8 GEMM: ``h_t``'s rows quantized here
    (:func:`quantize_rows_fp8`), ``head8`` the head's FP8 copy and scales (:func:`fp8_head`, its rows
    padded to a multiple of 16); written into ``out`` when given. A padded head's GEMM writes a
    temporary ``[rows, padded]`` and its first ``vocab`` columns are copied out."""
    h8, h_scale = quantize_rows_fp8(h_t)
    w8, w_scale = head8
    if w8.shape[0] == vocab and out is not None:
        return torch._scaled_mm(h8, w8.t(), h_scale, w_scale, out_dtype=out_dtype, out=out)
    z = torch._scaled_mm(h8, w8.t(), h_scale, w_scale, out_dtype=out_dtype)[:, :vocab]
    return z if out is None else out.copy_(z)


def fp8_support_problem(device: torch.device, out_dtype: torch.dtype) -> str | None:
    """None if ``torch._scaled_mm`` with one float8 scale per row runs on ``device`` and writes
    ``out_dtype``, else what went wrong. Probed once per device and dtype, on a 16 x 16 product."""
    key = (str(device), out_dtype)
    if key not in _fp8_support:
        problem = None
        if FP8_DTYPE is None or not hasattr(torch, "_scaled_mm"):
            problem = "this torch has no float8_e4m3fn or no torch._scaled_mm"
        else:
            try:
                a = torch.ones(16, 16, device=device).to(FP8_DTYPE)
                out = torch._scaled_mm(a, a.t(), torch.ones(16, 1, device=device), torch.ones(1, 16, device=device),
                                       out_dtype=out_dtype)
                if not bool((out.float() == 16).all()):
                    problem = "torch._scaled_mm gave a wrong product"
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
                problem = f"torch._scaled_mm with row-wise scales failed ({str(exc).strip().splitlines()[0]})"
        _fp8_support[key] = problem
    return _fp8_support[key]


def fp8_head_problem(vocab: int, d: int, device: torch.device, out_dtype: torch.dtype) -> str | None:
    """None if the FP8 teacher GEMM can run for a ``[vocab, d]`` head on ``device``, else why not
    (the size first: it needs no device). The vocabulary may be any size (:func:`fp8_head` pads it)."""
    if d % FP8_ALIGN:
        return (f"the head is [{vocab}, {d}], and FP8 GEMMs need the hidden size {d} to be a multiple of {FP8_ALIGN} "
                "(the vocabulary is padded, the hidden size cannot be)")
    return fp8_support_problem(device, out_dtype)


def check_teacher_fp8(weight: torch.Tensor, out_dtype: torch.dtype) -> None:
    """Raise before any work, naming the problem and the fix, where the FP8 teacher GEMM cannot run."""
    problem = fp8_head_problem(*weight.shape, weight.device, out_dtype)
    if problem is None:
        return
    where = weight.device.type
    if where == "cuda":
        major, minor = torch.cuda.get_device_capability(weight.device)
        where = f"{torch.cuda.get_device_name(weight.device)} (compute capability {major}.{minor})"
    raise RuntimeError(
        f"teacher_fp8=True cannot run on {where} with torch {torch.__version__}, {out_dtype} logits: {problem}. "
        "It needs torch._scaled_mm with one float8_e4m3fn scale per row (on CUDA: a bf16 head and a GPU "
        "and torch build that have row-wise scaled FP8 GEMMs, e.g. an H100/H200 with torch >= 2.5 for CUDA 12); "
        "otherwise use teacher_fp8=False (the default: teacher logits in the head's dtype)")


def _drop_fp8_head(ref, key):  # the head was freed: free its FP8 copy too (unless a newer head took the key)
    if _fp8_heads.get(key, (None,))[0] is ref:
        del _fp8_heads[key]


def fp8_head_rows(vocab: int) -> int:
    """Rows of the FP8 head for a vocabulary: rounded up to a multiple of FP8_ALIGN."""
    return -(-vocab // FP8_ALIGN) * FP8_ALIGN


def fp8_head(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The head for the FP8 teacher GEMM: ``(w8 [V', d] float8_e4m3fn, scale [1, V'] fp32)``, ``W ~= w8 * scale^T``
    for its first ``V`` rows; ``V'`` is ``V`` rounded up to a multiple of 16 (FP8 GEMMs need one), the
    rows past ``V`` zero (the real vocabularies, 151,936 and 248,320, need no padding).

    Cached for one head at a time (the copy takes ``V' x d`` bytes: 0.72 GiB at V=151,936, d=5120),
    keyed on the tensor object (held weakly: the copy goes when the head does), its data pointer,
    shape, strides and version counter. So an in-place write to the head (``copy_``,
    ``load_state_dict``, an optimizer step) or another head, even at the same address, is quantized
    afresh; only a write through ``.data``, which bypasses the version counter, is not seen (call
    :func:`clear_fp8_heads` after one). Inference tensors have no version counter and are not cached.
    """
    key = (weight.device, weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)
    version = None if weight.is_inference() else weight._version
    hit = _fp8_heads.get(key)
    if hit is not None and version is not None and hit[0]() is weight and hit[1] == version:
        return hit[2], hit[3]
    check_teacher_fp8(weight, weight.dtype)
    _fp8_heads.clear()  # before quantizing, so that two copies are never held at once
    vocab, d = weight.shape
    padded = fp8_head_rows(vocab)
    w8 = torch.zeros(padded, d, dtype=FP8_DTYPE, device=weight.device)
    scale = torch.ones(padded, 1, dtype=torch.float32, device=weight.device)
    for s in range(0, vocab, _FP8_HEAD_BLOCK):
        e = min(s + _FP8_HEAD_BLOCK, vocab)
        w8[s:e], scale[s:e] = quantize_rows_fp8(weight[s:e])
    scale = scale.view(1, padded)  # _scaled_mm takes the second operand's row scales as [1, V']
    if version is not None:
        _fp8_heads[key] = (weakref.ref(weight, lambda ref, k=key: _drop_fp8_head(ref, k)), version, w8, scale)
    return w8, scale


def clear_fp8_heads() -> None:
    """Forget the cached FP8 head (e.g. after writing the head through ``.data``)."""
    _fp8_heads.clear()


class ChunkLoop:
    """The fused path's work, chunk by chunk: the forward runs it, and so does ``bench --breakdown``.

    Per chunk ``k``: :meth:`logits` (cuBLAS writes the chunk's student and teacher logits into the
    workspace), :meth:`rows` (the Triton row kernels: stats and finish, for a weight function the
    weights from the chunk's CE, then the gradient), :meth:`grads` (cuBLAS turns the gradient left
    in the workspace into the chunk's rows of ``dL/dh_s`` and ``dL/dW``). The row kernels are
    launched from one place only, so the benchmark cannot fall out of step with them.

    Inputs as :func:`prepare_inputs` returns them: ``h_s``/``h_t`` ``[N, d]`` in the head's dtype
    (``h_t`` None without KL), ``labels`` int64 ``[N]``, ``row_weights`` ``[N]`` or a function
    ``f(row_ce, start, end)``.
    """

    def __init__(self, h_s, h_t, weight, labels, row_weights, *, temperature, kl_weight, ignore_index,
                 want_argmax=False, chunk_size=None, row_group=1, block_size=None, num_warps=None,
                 seg_size=None, one_logits_gemm=None, teacher_fp8=None, need_grad_h=True, need_grad_w=False,
                 skip_tiles=None, skip_mass=None, skip_min=None, skip_gemm=None, top_k=0,
                 labels_from_teacher=False):
        n_rows = h_s.shape[0]
        vocab = weight.shape[0]
        device = h_s.device
        self.h_s, self.h_t, self.weight, self.labels = h_s, h_t, weight, labels
        self.temperature, self.kl_weight, self.ignore_index = temperature, kl_weight, ignore_index
        self.vocab, self.want_argmax = vocab, want_argmax
        self.has_kl = kl_weight != 0
        self.has_ce = kl_weight != 1
        check_labels_from_teacher(labels_from_teacher, kl_weight)
        # the finish kernel writes each valid row's label (the teacher's argmax) into its own copy
        self.teacher_labels = labels_from_teacher
        if labels_from_teacher:
            self.labels = labels = labels.clone()
        self.separate_t = self.has_kl and temperature != 1.0
        self.square_t = self.has_kl and temperature == 2.0
        # First, so the head's quantization temporaries come and go before the workspace exists.
        fp8 = TEACHER_FP8 if teacher_fp8 is None else teacher_fp8
        self.head8 = fp8_head(weight) if fp8 and self.has_kl else None
        self.valid = labels != ignore_index
        self.weight_fn = row_weights if callable(row_weights) else None
        if self.weight_fn is None:
            self.scale = normalised_scale(labels, row_weights, ignore_index)
        else:
            # Weights from each chunk's CE: pass 1, the weights, then pass 2 with w_i' unnormalised; the
            # sum over all chunks is known only at the end, so 1 / sum(w') is applied in backward.
            if n_rows % row_group:
                raise ValueError(f"{n_rows} rows are not whole groups of row_group={row_group}")
            self.scale = torch.empty(n_rows, dtype=torch.float32, device=device)

        if chunk_size is None:
            chunk_size = default_chunk_size(n_rows, vocab, h_s.element_size(), self.has_kl)
        chunk_size = max(1, min(chunk_size, n_rows))
        if self.weight_fn is not None:  # a chunk holds whole groups
            chunk_size = max(row_group, chunk_size // row_group * row_group)
        self.chunk_size = chunk_size
        block, default_warps, seg = _launch_config(vocab, device)
        self.block = block_size or block
        self.num_warps = num_warps or default_warps
        if seg_size is None:  # the interpreter: two blocks per segment, so both merges run
            seg_size = 2 * self.block if device.type == "cpu" else seg
        seg = seg_size
        self.seg = max(self.block, seg // self.block * self.block)
        self.n_seg = triton.cdiv(vocab, self.seg)
        self.parts = torch.empty(chunk_size, self.n_seg, _NPART, dtype=torch.float32, device=device)
        self.norms = torch.empty(chunk_size, 5, dtype=torch.float32, device=device)

        self.bounds = [(s, min(s + chunk_size, n_rows)) for s in range(0, n_rows, chunk_size)]
        self.workspace = torch.empty((2 if self.has_kl else 1) * chunk_size, vocab, dtype=h_s.dtype, device=device)
        self.row_ce = torch.empty(n_rows, dtype=torch.float32, device=device)
        self.row_kl = torch.zeros(n_rows, dtype=torch.float32, device=device)
        self.argmax = torch.empty(n_rows if want_argmax else 1, dtype=torch.int32, device=device)
        self.top_k = top_k
        self.top_ids = torch.empty(n_rows, top_k, dtype=torch.int64, device=device) if top_k else None
        self.grad_h = torch.empty_like(h_s) if need_grad_h else None
        self.grad_w = torch.zeros_like(weight) if need_grad_w else None
        self.kernels = _row_kernels_for(device)
        one = ONE_LOGITS_GEMM if one_logits_gemm is None else one_logits_gemm
        self.stage = (torch.empty(2 * chunk_size, h_s.shape[1], dtype=h_s.dtype, device=device)
                      if one and self.has_kl and self.head8 is None and len(self.bounds) > 0 else None)
        self.weight_t = weight.t()

        # Tile skipping in the gradient GEMM (d loss / d h_s only; a head gradient is computed whole).
        bound = float(SKIP_MASS if skip_mass is None else skip_mass)
        if bound < 0:
            raise ValueError(f"skip_mass must be >= 0, got {skip_mass}")
        on = SKIP_TILES if skip_tiles is None else skip_tiles
        self.skip_mass = bound if on and need_grad_h else 0.0
        self.skip_min = SKIP_MIN_FRACTION if skip_min is None else skip_min
        self.skip_pairs = self.skip_pairs_skipped = self.skip_chunks = 0
        if self.skip_mass > 0:
            if skip_gemm is None:
                skip_gemm = SKIP_GEMM if device.type == "cuda" else (16, 16, 16, 1, 1, 2)
            self.skip_gemm = skip_gemm
            bm, tile = skip_gemm[:2]
            if self.block % tile:
                raise ValueError(f"skip tile of {tile} columns does not divide the row kernel's step {self.block}")
            self.n_tiles = triton.cdiv(vocab, tile)
            self.mass = torch.zeros(triton.cdiv(chunk_size, bm) * bm, self.n_tiles, dtype=torch.float32,
                                    device=device)
            self.part = None  # [splits, rows, d] fp32, made at the first chunk that skips
            self.row_skipped = torch.zeros(n_rows, dtype=torch.float32, device=device)
            self.row_l1 = torch.zeros(n_rows, dtype=torch.float32, device=device)

    def __len__(self):
        return len(self.bounds)

    def _views(self, k):
        start, end = self.bounds[k]
        z_s = self.workspace[: end - start]
        z_t = self.workspace[self.chunk_size:self.chunk_size + end - start] if self.has_kl else z_s
        return start, end, z_s, z_t

    def logits(self, k):
        start, end, z_s, z_t = self._views(k)
        c = self.chunk_size
        if self.stage is not None and end - start == c:  # one GEMM writes both halves of the workspace
            self.stage[:c].copy_(self.h_s[start:end])
            self.stage[c:].copy_(self.h_t[start:end])
            torch.mm(self.stage, self.weight_t, out=self.workspace)
            return
        torch.mm(self.h_s[start:end], self.weight_t, out=z_s)
        if self.head8 is not None:  # FP8 teacher: the chunk's rows quantized here, the head once (cached)
            fp8_teacher_logits(self.h_t[start:end], self.head8, self.vocab, z_t.dtype, out=z_t)
        elif self.has_kl:
            torch.mm(self.h_t[start:end], self.weight_t, out=z_t)

    def _launch(self, k, which):
        start, end, z_s, z_t = self._views(k)
        rows = end - start
        stats, finish, grad = self.kernels[:3]
        inv_t = 1.0 / self.temperature
        consts = dict(HAS_KL=self.has_kl, SEPARATE_T=self.separate_t)
        try:
            if which == 1:
                stats[(rows, self.n_seg)](
                    z_s, z_t, z_s.stride(0), z_t.stride(0), self.labels[start:end], self.parts,
                    self.vocab, self.seg, inv_t, self.ignore_index,
                    SQUARE_T=self.square_t, WRITE_ARGMAX=self.want_argmax, TEACHER_LABEL=self.teacher_labels,
                    NPART=_NPART, BLOCK=self.block, num_warps=self.num_warps, **consts)
                finish[(rows,)](
                    self.parts, self.n_seg, self.labels[start:end], self.row_ce[start:end],
                    self.row_kl[start:end], self.argmax[start:end] if self.want_argmax else self.argmax,
                    self.norms, self.vocab, inv_t, self.ignore_index,
                    WRITE_ARGMAX=self.want_argmax, TEACHER_LABEL=self.teacher_labels, NPART=_NPART,
                    SEG_P2=triton.next_power_of_2(self.n_seg), num_warps=1, **consts)
            else:
                skipping = self.skip_mass > 0
                grad[(rows, self.n_seg)](
                    z_s, z_t, z_s.stride(0), z_t.stride(0), self.labels[start:end], self.scale[start:end],
                    self.norms, self.vocab, self.seg, inv_t, 1.0 - self.kl_weight,
                    self.kl_weight * self.temperature, self.mass if skipping else self.norms,
                    self.n_tiles if skipping else 1, HAS_CE=self.has_ce, SQUARE_T=self.square_t,
                    BLOCK=self.block, WRITE_MASS=skipping, TILE=self.skip_gemm[1] if skipping else 1,
                    num_warps=self.num_warps, **consts)
        except Exception as exc:
            if _interpreted_kernels is None or self.kernels is not _interpreted_kernels:
                raise
            # Recent Triton cannot interpret a kernel whose triton.language helpers were compiled.
            raise RuntimeError(
                "the Triton kernel could not run on CPU tensors: set TRITON_INTERPRET=1 before triton is "
                "first imported, or use impl='torch' (impl='auto' picks it for CPU tensors)"
            ) from exc

    def rows(self, k):
        """The row kernels on chunk k: statistics (per segment, then merged per row), then
        d loss / d z_s in place of the student logits. A weight function runs in between, on the
        chunk's CE. With ``top_k`` the rows' top-k student logits are taken first, while the
        workspace still holds them (DFlash 2's candidates: no logits GEMM of their own)."""
        if self.top_k:
            start, end, z_s, _ = self._views(k)
            self.top_ids[start:end] = top_k_ids(z_s, self.top_k)
        self._launch(k, 1)
        if self.weight_fn is not None:
            start, end = self.bounds[k]
            w = self.weight_fn(self.row_ce[start:end], start, end).reshape(-1).to(torch.float32)
            self.scale[start:end] = torch.where(self.valid[start:end], w, 0.0)
        self._launch(k, 2)

    def grads(self, k):  # the workspace's student half now holds d loss / d z_s for these rows
        start, end, z_s, _ = self._views(k)
        if self.grad_h is not None and not (self.skip_mass > 0 and self._skipping_grad_h(k)):
            torch.mm(z_s, self.weight, out=self.grad_h[start:end])
        if self.grad_w is not None:
            self.grad_w.addmm_(z_s.t(), self.h_s[start:end])

    def _skipping_grad_h(self, k):
        """Chunk k's ``d loss / d h_s`` with the skipping GEMM, if enough (row block, tile) pairs can be
        skipped (one host sync per chunk to decide); False if cuBLAS should compute it whole."""
        start, end, z_s, _ = self._views(k)
        rows = end - start
        bm, tile, bn, warps, stages, split = self.skip_gemm
        seen = []

        def worth(skipped, pairs):
            seen.append((skipped, pairs))
            return skipped > 0 and skipped >= self.skip_min * pairs

        kept, count, row_skipped, row_total = skip_plan(self.mass, rows, bm, self.skip_mass, worth)
        self.row_l1[start:end] = row_total
        skipped, pairs = seen[0]
        self.skip_pairs += pairs
        if kept is None:
            return False
        self.skip_pairs_skipped += skipped
        self.skip_chunks += 1
        self.row_skipped[start:end] = row_skipped
        d = self.weight.shape[1]
        if self.part is None:
            self.part = torch.empty(split * self.chunk_size * d, dtype=torch.float32, device=z_s.device)
        part = self.part[: split * rows * d].view(split, rows, d)
        grid = (split * triton.cdiv(rows, bm) * triton.cdiv(d, bn),)
        self.kernels[3][grid](
            z_s, self.weight, part, kept, count, rows, self.vocab, d, z_s.stride(0), self.weight.stride(0),
            self.n_tiles, SPLIT=split, BM=bm, BN=bn, TILE=tile, IEEE=z_s.dtype == torch.float32,
            num_warps=warps, num_stages=stages)
        if self.grad_h.dtype == torch.float32:
            torch.sum(part, 0, out=self.grad_h[start:end])
        else:
            self.grad_h[start:end].copy_(part.sum(0))
        return True

    def skip_report(self) -> dict:
        """What tile skipping left out of the gradient GEMM: ``skip_mass`` (the bound), ``pairs`` and
        ``pairs_skipped`` ((row block, vocabulary tile) pairs seen and skipped), ``chunks_skipping``,
        and as 0-d fp32 tensors (no host sync) ``max_row_fraction`` (the largest share of any row's
        L1 gradient mass wrt its logits that was skipped; at most ``skip_mass``) and
        ``mass_fraction`` (skipped L1 mass over all rows' L1 mass)."""
        rep = dict(skip_mass=self.skip_mass, pairs=self.skip_pairs, pairs_skipped=self.skip_pairs_skipped,
                   chunks_skipping=self.skip_chunks)
        if self.skip_mass > 0:
            total = self.row_l1.sum()
            rep["max_row_fraction"] = self.row_skipped.max() if self.row_skipped.numel() else total * 0
            rep["mass_fraction"] = (self.row_skipped * self.row_l1).sum() / total.clamp_min(
                torch.finfo(torch.float32).tiny)
        else:
            zero = torch.zeros((), dtype=torch.float32, device=self.h_s.device)
            rep["max_row_fraction"] = rep["mass_fraction"] = zero
        return rep

    def run(self):
        # In order, on one stream. Running the row kernel of chunk k on a side stream while cuBLAS
        # computes chunk k+1's logits (two workspaces) was measured on an H200 and gained nothing:
        # the GEMMs keep every SM busy, so the memory-bound kernel cannot slip in beside them.
        for k in range(len(self.bounds)):
            self.logits(k)
            self.rows(k)
            self.grads(k)

    def loss(self):
        """(loss, 1 / sum w' or None): None when the gradient is already normalised (tensor weights)."""
        row_loss = (1.0 - self.kl_weight) * self.row_ce + self.kl_weight * self.row_kl
        if self.weight_fn is None:
            return (self.scale * row_loss).sum(), None
        total = self.scale.sum()
        inv_norm = 1.0 / torch.where(total > 0, total, torch.ones_like(total))
        return (self.scale * row_loss).sum() * inv_norm, inv_norm


class _FusedLinearDistillLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_s, h_t, weight, labels, row_weights, temperature, kl_weight, ignore_index,
                want_argmax, chunk_size, block_size, num_warps, row_group, seg_size, one_logits_gemm, teacher_fp8,
                skip_tiles, skip_mass, skip_min, skip_report, top_k, labels_from_teacher):
        loop = ChunkLoop(h_s, h_t, weight, labels, row_weights, temperature=temperature, kl_weight=kl_weight,
                         ignore_index=ignore_index, want_argmax=want_argmax, chunk_size=chunk_size,
                         row_group=row_group, block_size=block_size, num_warps=num_warps, seg_size=seg_size,
                         one_logits_gemm=one_logits_gemm, teacher_fp8=teacher_fp8,
                         need_grad_h=ctx.needs_input_grad[0], need_grad_w=ctx.needs_input_grad[2],
                         skip_tiles=skip_tiles, skip_mass=skip_mass, skip_min=skip_min, top_k=top_k,
                         labels_from_teacher=labels_from_teacher)
        loop.run()
        if skip_report is not None:
            skip_report.update(loop.skip_report())
        loss, inv_norm = loop.loss()
        valid = loop.valid
        correct = (loop.argmax.long() == loop.labels) & valid if want_argmax else torch.zeros_like(valid)
        top_ids = loop.top_ids if top_k else torch.empty(0, dtype=torch.int64, device=h_s.device)
        ctx.save_for_backward(loop.grad_h, loop.grad_w, inv_norm)
        ctx.mark_non_differentiable(loop.row_ce, correct, top_ids, loop.labels)
        return loss, loop.row_ce, correct, top_ids, loop.labels

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_correct, _grad_top, _grad_labels):
        grad_h, grad_w, inv_norm = ctx.saved_tensors

        def scaled(g):
            if g is None:
                return None
            if inv_norm is None:
                return g * grad_loss.to(g.dtype)
            # one rounding of the fp32 product, not of a bf16-rounded 1 / sum(w')
            return (g.float() * (grad_loss.float() * inv_norm)).to(g.dtype)

        # Out of place so that a retained graph can be backpropagated more than once.
        return (scaled(grad_h), None, scaled(grad_w), None, None, None, None, None, None, None, None, None,
                None, None, None, None, None, None, None, None, None, None)


def prepare_inputs(student_hidden, teacher_hidden, lm_head_weight, labels, row_weights, *, temperature,
                   kl_weight, row_group=1):
    """Checked, flattened, contiguous inputs for :class:`ChunkLoop`: ``(h_s, h_t, weight, labels, w)``.

    Hidden states become ``[N, d]`` rows in the head's dtype (``h_t`` detached, None without KL),
    labels int64 ``[N]``, tensor weights ``[N]`` (a weight function is passed through).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if kl_weight != 0 and teacher_hidden is None:
        raise ValueError("kl_weight != 0 needs teacher_hidden")
    d = student_hidden.shape[-1]
    dtype = lm_head_weight.dtype
    h_s = student_hidden.reshape(-1, d).to(dtype).contiguous()
    h_t = None
    if kl_weight != 0:
        h_t = teacher_hidden.detach().reshape(-1, d).to(dtype).contiguous()
    y = labels.reshape(-1).to(torch.int64).contiguous()
    w = row_weights if callable(row_weights) else row_weights.reshape(-1)
    n_w = y.shape[0] if callable(w) else w.shape[0]
    if not (h_s.shape[0] == y.shape[0] == n_w) or (h_t is not None and h_t.shape != h_s.shape):
        raise ValueError("student_hidden, teacher_hidden, labels and row_weights must agree on rows")
    if row_group < 1:
        raise ValueError(f"row_group must be >= 1, got {row_group}")
    return h_s, h_t, lm_head_weight.contiguous(), y, w


def triton_fused_linear_distill_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor | None,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights,
    *,
    temperature: float = 1.0,
    kl_weight: float = 0.0,
    ignore_index: int = -100,
    return_row_stats: bool = False,
    row_group: int = 1,
    chunk_size: int | None = None,
    block_size: int | None = None,
    num_warps: int | None = None,
    seg_size: int | None = None,
    one_logits_gemm: bool | None = None,
    teacher_fp8: bool | None = None,
    skip_tiles: bool | None = None,
    skip_mass: float | None = None,
    skip_report: dict | None = None,
    skip_min: float | None = None,
    top_k: int = 0,
    labels_from_teacher: bool = False,
):
    """The fused path. Same contract as :func:`flashfleet_kernels.fused_linear_distill_loss`.

    Hidden states may be ``[..., d]``; they are flattened to rows. They are cast to the head's
    dtype (all matmuls run in it). ``chunk_size`` (rows per chunk), ``block_size`` (vocabulary
    columns per kernel step), ``num_warps``, ``seg_size`` (vocabulary columns per segment) and
    ``one_logits_gemm`` (student and teacher logits as one GEMM) are tuning knobs; the defaults keep
    the workspace at 768 MiB. With callable ``row_weights`` the weights are computed per chunk
    between the statistics and the gradient kernels, and chunks are rounded down to whole
    ``row_group``s. ``teacher_fp8=True`` (default :data:`TEACHER_FP8`, off) computes the teacher
    logits with an FP8 GEMM (row-wise scales; the head quantized once and cached, see
    :func:`fp8_head`); it raises a RuntimeError up front where the device or torch cannot.

    ``skip_tiles=True`` (default :data:`SKIP_TILES`, off) leaves negligible (row block, vocabulary
    tile) pairs out of the gradient GEMM to ``d loss / d h_s``; ``skip_mass`` (default
    :data:`SKIP_MASS`, 2^-10; 0 skips nothing) bounds it: no row loses more than this share of the L1
    mass of its gradient wrt the logits (see :func:`skip_plan`). Loss, CE and argmax are never
    affected, nor is a head gradient. A dict passed as ``skip_report`` is filled with what was skipped
    (:meth:`ChunkLoop.skip_report`). ``skip_min`` (default :data:`SKIP_MIN_FRACTION`) is the share of
    (row block, tile) pairs a chunk must be able to skip for the skipping GEMM to run instead of cuBLAS.
    """
    h_s, h_t, weight, y, w = prepare_inputs(student_hidden, teacher_hidden, lm_head_weight, labels, row_weights,
                                            temperature=temperature, kl_weight=kl_weight, row_group=row_group)
    check_top_k(top_k, weight.shape[0])
    loss, row_ce, correct, top_ids, used = _FusedLinearDistillLoss.apply(
        h_s, h_t, weight, y, w, float(temperature), float(kl_weight), int(ignore_index),
        bool(return_row_stats), chunk_size, block_size, num_warps, int(row_group), seg_size, one_logits_gemm,
        teacher_fp8, skip_tiles, skip_mass, skip_min, skip_report, int(top_k), bool(labels_from_teacher),
    )
    out = (loss, row_ce, correct) if return_row_stats else (loss,)
    if top_k:
        out += (top_ids,)
    if labels_from_teacher:
        out += (used,)
    return out if len(out) > 1 else loss
