"""The drafter loss: one entry point, position weights, and cheap detached statistics.

`drafter_loss` is the only place the trainer computes a loss. It calls a loss function with the
signature of `flashfleet_kernels.fused_linear_distill_loss(student_hidden, teacher_hidden,
lm_head_weight, labels, row_weights, *, temperature, kl_weight, ignore_index)`, which returns

    sum_i w_i * loss_i / sum_i w_i,
    loss_i = kl_weight * T^2 * KL(softmax(z_t/T) || softmax(z_s/T)) + (1 - kl_weight) * CE(z_s, y_i)

with z = hidden @ lm_head_weight.T. The loss itself lives in flashfleet_kernels only: the fused
Triton kernel, which never materializes the [rows x vocab] logits, and its plain-torch reference
(`flashfleet_kernels.reference`, the kernel's test oracle and the CPU path). `get_loss_fn` picks
between them through the kernels package's dispatcher; this module has no loss of its own.

Streak weights and per-position accuracy need per-row CE and argmax, and the streak weights are
needed *before* the loss is weighted. The loss computes both anyway, so they come from it
(`return_row_stats=True`), and the streak weights are given as a function of the rows' CE that
the loss calls chunk by chunk (whole blocks per chunk, `row_group`=block size - 1: the anchor's row
never reaches the loss), before it writes the weighted gradient: no second logits pass. The logged KL is recovered from the loss value and
the weighted CE by algebra instead of a second teacher pass. The statistics stay on the device
(`host_stats=False`) until the trainer reads them once per optimizer step.
"""

import functools
import math

import torch

from .defaults import DECAY_GAMMAS

IGNORE = -100


def get_loss_fn(impl: str = "auto", teacher_fp8: bool = False):
    """(function, name): `flashfleet_kernels.fused_linear_distill_loss` with `impl` bound (and
    `teacher_fp8`, the Triton path's FP8 teacher logits, when True).

    'auto': the Triton kernel for CUDA tensors and the torch reference for CPU tensors, decided
    per call by the dispatcher; named "triton" when Triton is importable, else "torch".
    'triton' insists on the kernel: ImportError here when Triton is not importable.
    'torch': always the plain-torch reference (materializes the fp32 logits).
    The kernels package (and with it Triton) is imported here, not when this module is.
    """
    from flashfleet_kernels import fused_linear_distill_loss, triton_fused_linear_distill_loss

    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"impl must be 'auto', 'triton' or 'torch', got {impl!r}")
    if impl == "triton" and triton_fused_linear_distill_loss is None:
        raise ImportError("triton is not importable, so flashfleet_kernels has no fused kernel")
    name = impl
    if impl == "auto":
        name = "triton" if triton_fused_linear_distill_loss is not None else "torch"
    fp8 = {"teacher_fp8": True} if teacher_fp8 else {}
    return functools.partial(fused_linear_distill_loss, impl=impl, **fp8), name + ("+teacher_fp8" if teacher_fp8 else "")


def default_gamma(block_size: int) -> float:
    """DFlash's decay gamma for a block size (defaults.DECAY_GAMMAS)."""
    return next((g for b, g in DECAY_GAMMAS if block_size >= b), DECAY_GAMMAS[-1][1])


def position_weights(kind: str, valid, ce=None, *, alpha: float = 0.5, gamma: float | None = None):
    """Per-row weights [N, B] for block positions; position 0 (the anchor) and invalid rows get 0.

    decay:   w_k = exp(-(k-1)/gamma)
    uniform: w_k = 1
    streak:  q_k = exp(-CE_k) (detached) is position k's chance of being accepted, smoothed to
             s_k = (1-alpha) q_k + alpha; P_k = prod_{i=1..k} s_i is the chance that the streak
             reaches k, and w_k = sum_{j>=k} P_j = d E[accepted] / d log q_k: how many expected
             accepted tokens depend on position k. An invalid position ends the streak (s = 0).
    """
    n, b = valid.shape
    valid = valid.clone()
    valid[:, 0] = False
    k = torch.arange(b, device=valid.device, dtype=torch.float32)
    if kind == "uniform":
        w = torch.ones(n, b, device=valid.device)
    elif kind == "decay":
        g = default_gamma(b) if gamma is None else gamma
        w = torch.exp(-(k - 1) / g).expand(n, b)
    elif kind == "streak":
        if ce is None:
            raise ValueError("streak weighting needs per-row CE")
        s = (1 - alpha) * torch.exp(-ce.detach().float()) + alpha
        s = torch.where(valid, s, torch.zeros_like(s))
        s[:, 0] = 1.0  # the anchor is given, not predicted
        prefix = torch.cumprod(s, dim=1)
        w = prefix.flip(1).cumsum(1).flip(1)  # suffix sums
    else:
        raise ValueError(f"unknown weighting {kind!r}")
    return w * valid.float()


def acceptance_proxy(acc: list[float]) -> float:
    """sum_k prod_{i<=k} acc_i over block positions 1..B-1 (tau is about 1 + this)."""
    total, run = 0.0, 1.0
    for a in acc:
        if a is None or math.isnan(a):
            break
        run *= a
        total += run
    return total


ARGMAX_CHUNK_ELEMENTS = 1 << 26  # logits per chunk of target_argmax_labels (256 MiB in fp32)


@torch.no_grad()
def target_argmax_labels(teacher_hidden, lm_head_weight, labels):
    """`labels` [N, P] with each supervised row's token replaced by the target's most likely token
    there, argmax(teacher_hidden @ lm_head_weight.T); IGNORE rows stay IGNORE. The logits are made
    a chunk of rows at a time and never kept whole ([rows x vocab] is gigabytes at a real
    vocabulary); every row is computed, supervised or not, so nothing waits on the device for a
    count of valid rows."""
    w = lm_head_weight
    h = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).to(w.dtype)  # the head is the large one: never cast it
    step = max(1, ARGMAX_CHUNK_ELEMENTS // w.shape[0])
    top = torch.cat([(h[i:i + step] @ w.T).argmax(-1) for i in range(0, h.shape[0], step)])
    return torch.where(labels != IGNORE, top.view(labels.shape), labels)


def drafter_loss(student_hidden, teacher_hidden, lm_head_weight, labels, *, loss_fn, weighting="streak",
                 streak_alpha=0.5, decay_gamma=None, use_soft_labels=False, kl_temperature=1.0, kl_weight=0.0,
                 ce_target="data", top_k=0, host_stats=True):
    """Loss and statistics for one micro-batch of blocks.

    student_hidden [N, B, H]: drafter output (after its final norm); teacher_hidden [N, B, H]:
    the target's final normed hidden state at position anchor+k-1 (None without soft labels or
    target-argmax labels); labels [N, B]: token at anchor+k, IGNORE where unsupervised (always at
    k = 0). ce_target "target-argmax": the CE term (and the accuracy) takes the target's most
    likely token at each supervised row instead of the data's: with soft labels the loss takes it
    from its own teacher logits (labels_from_teacher), else target_argmax_labels computes it.
    Returns (loss, stats) with stats: ce (weighted mean), kl (weighted mean or None),
    acc (per position 1..B-1; NaN where no valid row), rows (valid rows), weights [N, B],
    correct and count (per position 1..B-1), labels [N, B-1] (the CE's labels of positions 1..B-1,
    the data's or the target's argmax: DFlash 2's selector loss takes the same), and with top_k > 0
    top_ids [N, B-1, top_k] (each predicted row's top_k student logits' ids, best first: DFlash 2's
    candidates). Per-row CE, argmax and the top-k come from the loss itself.
    With host_stats=False nothing is read back to the host: ce, kl (float64), correct, count and
    rows stay 0-d/1-d tensors on the device and acc is absent (`stats_to_host` makes the rest).
    """
    n, b = labels.shape
    if b < 2:
        raise ValueError(f"blocks of {b} position(s) predict nothing: a block is the anchor plus at least one "
                         "predicted token (block size >= 2)")
    valid = labels != IGNORE
    # Position 0 is the anchor: given, never predicted, its label always IGNORE. Its rows stay out of
    # the loss (1/b of the loss's logits GEMMs saved); weights and statistics keep the [n, b] layout.
    pred, p = slice(1, None), b - 1  # the predicted positions, and how many a block has
    if weighting == "streak":
        weights = torch.zeros(n, b, dtype=torch.float32, device=labels.device)

        def row_weights(ce, start, end):  # called by the loss with whole blocks of predicted rows
            ce = torch.cat([ce.new_zeros(ce.numel() // p, 1), ce.view(-1, p)], dim=1)
            w = position_weights("streak", valid[start // p:end // p], ce, alpha=streak_alpha)[:, pred]
            weights[start // p:end // p, pred] = w
            return w.reshape(-1)
    else:
        weights = position_weights(weighting, valid, gamma=decay_gamma)
        row_weights = weights[:, pred]
    kw = kl_weight if use_soft_labels else 0.0
    hard = labels[:, pred]
    if ce_target not in ("data", "target-argmax"):
        raise ValueError(f"unknown ce_target {ce_target!r}")
    # The target's argmax: from the loss's own teacher logits when the KL term computes them, else
    # from a logits pass of its own (one more vocabulary GEMM)
    in_loss = ce_target == "target-argmax" and kw > 0
    if ce_target == "target-argmax" and not in_loss:
        hard = target_argmax_labels(teacher_hidden[:, pred], lm_head_weight, hard)
    extra = ({"top_k": top_k} if top_k else {}) | ({"labels_from_teacher": True} if in_loss else {})
    loss, ce, correct, *more = loss_fn(student_hidden[:, pred], teacher_hidden[:, pred] if kw > 0 else None,
                                       lm_head_weight, hard, row_weights, temperature=kl_temperature,
                                       kl_weight=kw, ignore_index=IGNORE, return_row_stats=True, row_group=p,
                                       **extra)
    top_ids = more[:1] if top_k else []
    if in_loss:
        hard = more[-1].view(n, p)
    ce, correct = ce.view(n, p), correct.view(n, p)
    wsum = weights.sum().clamp_min(1e-12)
    ce_w = ((weights[:, pred] * ce).sum() / wsum).double()
    kl = None
    if kw > 0:
        kl = (loss.detach().double() - (1 - kw) * ce_w) / (kw * kl_temperature ** 2)
    stats = {"ce": ce_w, "kl": kl, "rows": valid.sum(), "weights": weights,
             "correct": correct.sum(0), "count": valid[:, pred].sum(0).float(), "labels": hard}
    if top_ids:
        stats["top_ids"] = top_ids[0].view(n, p, top_k)
    return loss, (stats_to_host(stats) if host_stats else stats)


def stats_to_host(stats: dict) -> dict:
    """drafter_loss's device statistics as Python numbers, read back in one transfer."""
    kl = stats["kl"]
    acc = stats["correct"].float() / stats["count"]  # NaN where a position has no valid row
    parts = [stats["ce"].reshape(1), (kl if kl is not None else stats["ce"]).reshape(1),
             stats["rows"].reshape(1), stats["correct"], stats["count"], acc]
    vals = torch.cat([p.double() for p in parts]).tolist()
    b1 = stats["correct"].shape[0]
    return {"ce": vals[0], "kl": vals[1] if kl is not None else None, "rows": int(vals[2]),
            "weights": stats["weights"], "correct": [int(c) for c in vals[3:3 + b1]],
            "count": vals[3 + b1:3 + 2 * b1], "acc": vals[3 + 2 * b1:]}
