"""flashfleet_kernels: the DFlash drafter loss without materializing ``[tokens x vocab]``.

Public entry point: :func:`fused_linear_distill_loss`; oracle: :func:`reference_fused_linear_distill_loss`,
the project's only torch version of the loss (the trainer reaches both through
``flashfleet_trainer.loss.get_loss_fn``, which binds ``impl``).
See docs/kernels.md for the math, the design and the test/benchmark commands.
"""

from __future__ import annotations

import torch

from .reference import reference_fused_linear_distill_loss

try:  # Triton is optional: CPU-only installs fall back to the reference.
    from .distill_loss import triton_fused_linear_distill_loss
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton_fused_linear_distill_loss = None

__all__ = [
    "fused_linear_distill_loss",
    "reference_fused_linear_distill_loss",
    "triton_fused_linear_distill_loss",
]


def fused_linear_distill_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor | None,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights,
    *,
    temperature: float = 1.0,
    kl_weight: float = 0.0,
    ignore_index: int = -100,
    impl: str = "auto",
    return_row_stats: bool = False,
    row_group: int = 1,
    chunk_size: int | None = None,
    teacher_fp8: bool | None = None,
    skip_tiles: bool | None = None,
    skip_mass: float | None = None,
    skip_report: dict | None = None,
    top_k: int = 0,
    labels_from_teacher: bool = False,
):
    """Per-row-weighted ``(1 - a) * CE + a * T^2 * KL(teacher || student)`` over ``z = h W^T``.

    Args:
        student_hidden: ``[..., d]`` drafter hidden states (after the final norm). Gets a gradient.
        teacher_hidden: ``[..., d]`` target hidden states; no gradient. May be None when
            ``kl_weight == 0``.
        lm_head_weight: ``[V, d]`` the target's LM head. Gets a gradient only if it requires one
            (through the student logits; the teacher distribution is treated as a constant).
        labels: ``[...]`` int targets; ``ignore_index`` drops the row (CE and KL) entirely.
        row_weights: ``[...]`` per-row weights; the loss is ``sum w_i loss_i / sum w_i`` over rows
            that are not ignored (0 if no weight is left). Or a function ``f(row_ce, start, end)``
            that returns the weights of flattened rows ``start:end`` from their detached fp32 CE
            (weights that depend on the loss's own CE, e.g. streak weights): the Triton path calls
            it once per chunk between the row statistics and the gradient kernel, so it costs no extra logits
            GEMM; it must treat each ``row_group`` consecutive rows on their own. Its results are
            the weights used (keep them if you need them).
        temperature: T, applied to both student and teacher logits in the KL term only.
        kl_weight: a in [0, 1]; 0 is plain weighted CE.
        impl: ``"auto"`` (Triton on CUDA, reference elsewhere), ``"triton"`` or ``"torch"``.
        return_row_stats: also return ``row_ce`` (detached fp32 ``[N]`` CE per flattened row, 0 for
            ignored rows; ``exp(-row_ce)`` is the probability of the label) and
            ``row_argmax_correct`` (bool ``[N]``, ``argmax z_s == label``), at almost no extra cost.
        row_group: rows per group for a weight function (chunks hold whole groups; the number of
            rows must be a multiple of it). Ignored for tensor weights.
        chunk_size: rows per chunk for the Triton path (default: fits a 768 MiB workspace).
        teacher_fp8: Triton path only: the teacher logits from an FP8 GEMM with row-wise scales
            (the head quantized once and cached; off by default, see ``distill_loss.TEACHER_FP8``).
        skip_tiles, skip_mass, skip_report: Triton path only: leave (row block, vocabulary tile)
            pairs whose share of each row's gradient wrt the logits is within ``skip_mass`` out of
            the gradient GEMM, and report what was left out (off by default, see
            ``distill_loss.SKIP_TILES``). The torch reference always computes the whole gradient.
        top_k: above 0, also return each row's ``top_k`` largest student logits' ids (int64
            ``[N, top_k]``, best first, no gradient), taken from the logits the loss computes
            anyway: DFlash 2's candidate selector needs them, and a second pass over the
            vocabulary would cost one more ``N x d x V`` GEMM.
        labels_from_teacher: every row that is not ignored takes the teacher's most likely token,
            ``argmax z_t``, as its label instead of ``labels`` (CE, its gradient and the argmax
            statistics), taken from the teacher logits the KL term computes anyway, so it needs
            ``kl_weight != 0``: the drafter's labels as served (``--ce-target target-argmax``)
            with soft labels cost no GEMM of their own. The labels used are returned last.

    Returns:
        The scalar fp32 loss, or ``(loss, row_ce, row_argmax_correct)`` with ``return_row_stats``;
        with ``top_k`` the ids are appended: ``(loss, top_ids)`` or ``(loss, row_ce,
        row_argmax_correct, top_ids)``; with ``labels_from_teacher`` the labels used (int64 ``[N]``,
        ``ignore_index`` where ignored) after everything else.
    """
    if impl == "auto":
        impl = "triton" if student_hidden.is_cuda and triton_fused_linear_distill_loss is not None else "torch"
    kwargs = dict(temperature=temperature, kl_weight=kl_weight, ignore_index=ignore_index,
                  return_row_stats=return_row_stats, row_group=row_group, top_k=top_k,
                  labels_from_teacher=labels_from_teacher)
    if impl == "torch":
        if teacher_fp8:
            raise ValueError("teacher_fp8 is an option of the Triton path; the torch reference has no FP8 GEMM")
        return reference_fused_linear_distill_loss(
            student_hidden, teacher_hidden, lm_head_weight, labels, row_weights, **kwargs)
    if impl == "triton":
        if triton_fused_linear_distill_loss is None:
            raise RuntimeError("impl='triton' but triton is not importable")
        return triton_fused_linear_distill_loss(
            student_hidden, teacher_hidden, lm_head_weight, labels, row_weights,
            chunk_size=chunk_size, teacher_fp8=teacher_fp8, skip_tiles=skip_tiles, skip_mass=skip_mass,
            skip_report=skip_report, **kwargs)
    raise ValueError(f"impl must be 'auto', 'triton' or 'torch', got {impl!r}")
