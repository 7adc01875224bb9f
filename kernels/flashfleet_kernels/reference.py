"""Plain torch reference for the drafter distillation loss.

This is the oracle the Triton path is tested against and the fallback where Triton cannot run
(CPU trainers, CI). It materializes the full ``[N, V]`` logits in fp32 (fp64 when the inputs are
fp64, so finite differences work), which is exactly what the fused path exists to avoid: do not
use it at real shapes unless you have tens of GiB to spare.

The loss (see docs/kernels.md)::

    z_s = h_s W^T,  z_t = h_t W^T
    loss_i = a * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - a) * CE(z_s, y_i)
    loss   = sum_i w_i' loss_i / sum_i w_i'        with w_i' = w_i * [y_i != ignore_index]

A row whose label is ``ignore_index`` drops out of both sums (its KL term too). When every row
drops out the loss is 0 (not NaN) and so are the gradients. The teacher distribution is a
constant: no gradient flows to ``teacher_hidden``, nor to ``lm_head_weight`` through ``z_t``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _flatten(hidden: torch.Tensor | None) -> torch.Tensor | None:
    if hidden is None:
        return None
    return hidden.reshape(-1, hidden.shape[-1])


def reference_fused_linear_distill_loss(
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
    top_k: int = 0,
    labels_from_teacher: bool = False,
):
    """Weighted CE + temperature-scaled forward KL, computed the obvious way.

    Returns the scalar loss, or ``(loss, row_ce, row_argmax_correct)`` when ``return_row_stats``:
    ``row_ce`` is the detached fp32 per-row cross-entropy (0 for ignored rows) and
    ``row_argmax_correct`` is a bool per row, ``argmax(z_s) == y`` (False for ignored rows).
    ``top_k > 0`` appends ``top_ids``, int64 ``[N, top_k]``: each row's ``top_k`` largest student
    logits' ids, best first (every row, ignored or not). ``labels_from_teacher`` (needs
    ``kl_weight != 0``): each row that is not ignored takes the teacher's most likely token,
    ``argmax(z_t)``, as its label (CE and argmax statistics alike); ``labels_used`` (int64 ``[N]``,
    ``ignore_index`` where ignored) is appended last.

    ``row_weights`` may be a function ``f(row_ce, start, end)`` of the detached fp32 CE of rows
    ``start:end`` returning their weights; here it is called once on all rows. It must treat every
    ``row_group`` consecutive rows on their own (the fused path calls it chunk by chunk).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if kl_weight != 0 and teacher_hidden is None:
        raise ValueError("kl_weight != 0 needs teacher_hidden")
    check_top_k(top_k, lm_head_weight.shape[0])
    check_labels_from_teacher(labels_from_teacher, kl_weight)
    compute = torch.float64 if student_hidden.dtype == torch.float64 else torch.float32
    h_s = _flatten(student_hidden).to(compute)
    weight = lm_head_weight.to(compute)
    y = labels.reshape(-1)
    valid = y != ignore_index
    if callable(row_weights) and (row_group < 1 or y.shape[0] % row_group):
        raise ValueError(f"{y.shape[0]} rows are not whole groups of row_group={row_group}")

    z_s = h_s @ weight.T
    if kl_weight != 0:
        with torch.no_grad():
            z_t = _flatten(teacher_hidden).to(compute) @ weight.T
    if labels_from_teacher:
        y = torch.where(valid, z_t.argmax(dim=-1), y)
    log_q1 = F.log_softmax(z_s, dim=-1)
    safe_y = torch.where(valid, y, 0)
    ce = torch.where(valid, -log_q1.gather(1, safe_y[:, None]).squeeze(1), 0.0)
    if callable(row_weights):
        row_weights = row_weights(ce.detach().float(), 0, y.shape[0])
    w = torch.where(valid, row_weights.reshape(-1).to(compute), 0.0)
    row_loss = (1.0 - kl_weight) * ce
    if kl_weight != 0:
        with torch.no_grad():
            log_p = F.log_softmax(z_t / temperature, dim=-1)
        log_q = F.log_softmax(z_s / temperature, dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        row_loss = row_loss + kl_weight * temperature**2 * kl

    total = w.sum()
    loss = (w * row_loss).sum() / torch.where(total > 0, total, torch.ones_like(total))
    out = (loss,)
    if return_row_stats:
        out += (ce.detach().float(), (z_s.detach().argmax(dim=-1) == y) & valid)
    if top_k:
        out += (z_s.detach().topk(top_k, dim=-1).indices,)
    if labels_from_teacher:
        out += (y,)
    return out if len(out) > 1 else loss


def check_top_k(top_k: int, vocab: int) -> None:
    """Both paths' check of ``top_k``: 0 (off) up to the vocabulary."""
    if not 0 <= top_k <= vocab:
        raise ValueError(f"top_k must be between 0 (off) and the vocabulary of {vocab}, got {top_k}")


def check_labels_from_teacher(labels_from_teacher: bool, kl_weight: float) -> None:
    """Both paths' check: the teacher's argmax as the label needs the teacher's logits (a KL term)."""
    if labels_from_teacher and kl_weight == 0:
        raise ValueError("labels_from_teacher takes the teacher's argmax from the KL term's logits: it needs "
                         "kl_weight != 0 (compute the labels beforehand otherwise)")
