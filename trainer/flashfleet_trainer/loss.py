"""The drafter loss: one entry point, position weights, and cheap detached statistics.

`drafter_loss` is the only place the trainer computes a loss. It calls
`fused_linear_distill_loss(student_hidden, teacher_hidden, lm_head_weight, labels, row_weights,
*, temperature, kl_weight, ignore_index)`, which returns

    sum_i w_i * loss_i / sum_i w_i,
    loss_i = kl_weight * T^2 * KL(softmax(z_t/T) || softmax(z_s/T)) + (1 - kl_weight) * CE(z_s, y_i)

with z = hidden @ lm_head_weight.T. The fused Triton kernel (flashfleet_kernels) never
materializes the [rows x vocab] logits; `torch_fused_linear_distill_loss` below is the plain
torch version of the same signature, used until/unless the kernel is importable.

Streak weights and per-position accuracy need per-row CE and argmax *before* the loss. They are
detached, so `row_stats` gets them in row chunks under no_grad: a [chunk x vocab] tile at a
time, never a second full [rows x vocab] fp32 tensor. The logged KL is recovered from the loss
value and the weighted CE by algebra instead of a second teacher pass.
"""

import math

import torch
import torch.nn.functional as F

IGNORE = -100


def torch_fused_linear_distill_loss(student_hidden, teacher_hidden, lm_head_weight, labels, row_weights, *,
                                    temperature=1.0, kl_weight=0.0, ignore_index=IGNORE):
    """Plain-torch reference of flashfleet_kernels.fused_linear_distill_loss (same signature).

    Rows whose label is ignore_index get weight 0 (they have neither a hard nor a soft target:
    the soft target of a block position only exists where its label does).
    """
    h = student_hidden.reshape(-1, student_hidden.shape[-1])
    y = labels.reshape(-1)
    w = row_weights.reshape(-1).float() * (y != ignore_index).float()
    logits = (h @ lm_head_weight.t()).float()
    per_row = torch.zeros_like(w)
    if kl_weight < 1.0:
        ce = F.cross_entropy(logits, y.clamp_min(0), reduction="none")
        per_row = per_row + (1.0 - kl_weight) * ce
    if kl_weight > 0.0:
        t = temperature
        with torch.no_grad():
            teacher = (teacher_hidden.reshape(-1, teacher_hidden.shape[-1]) @ lm_head_weight.t()).float()
            log_p = F.log_softmax(teacher / t, dim=-1)
        log_q = F.log_softmax(logits / t, dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        per_row = per_row + kl_weight * t * t * kl
    return (w * per_row).sum() / w.sum().clamp_min(1e-12)


def get_loss_fn(impl: str = "auto"):
    """(function, name). 'triton' insists on the kernel; 'auto' falls back to plain torch."""
    if impl in ("auto", "triton"):
        try:
            from flashfleet_kernels import fused_linear_distill_loss

            return fused_linear_distill_loss, "triton"
        except ImportError:
            if impl == "triton":
                raise
    return torch_fused_linear_distill_loss, "torch"


@torch.no_grad()
def row_stats(hidden, lm_head_weight, labels, chunk_rows: int = 4096):
    """Per-row CE and correctness (argmax == label), detached, chunked over rows.

    hidden [..., H], labels [...] -> (ce, correct) shaped like labels; 0 where label is ignored.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    ce = torch.zeros(y.shape, dtype=torch.float32, device=h.device)
    correct = torch.zeros(y.shape, dtype=torch.bool, device=h.device)
    for s in range(0, h.shape[0], chunk_rows):
        logits = (h[s:s + chunk_rows] @ lm_head_weight.t()).float()
        yy = y[s:s + chunk_rows]
        ok = yy != IGNORE
        ce[s:s + chunk_rows] = F.cross_entropy(logits, yy.clamp_min(0), reduction="none") * ok
        correct[s:s + chunk_rows] = (logits.argmax(-1) == yy) & ok
    return ce.view(labels.shape), correct.view(labels.shape)


def default_gamma(block_size: int) -> float:
    """DFlash's decay gammas: 7 for block 16, 5 for block 10, 4 for block 8 (linear in between)."""
    if block_size >= 16:
        return 7.0
    if block_size >= 10:
        return 5.0
    return 4.0


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


def drafter_loss(student_hidden, teacher_hidden, lm_head_weight, labels, *, loss_fn, weighting="streak",
                 streak_alpha=0.5, decay_gamma=None, use_soft_labels=False, kl_temperature=1.0, kl_weight=0.0):
    """Loss and statistics for one micro-batch of blocks.

    student_hidden [N, B, H]: drafter output (after its final norm); teacher_hidden [N, B, H]:
    the target's final normed hidden state at position anchor+k-1 (None without soft labels);
    labels [N, B]: token at anchor+k, IGNORE where unsupervised (always at k = 0).
    Returns (loss, stats) with stats: ce (weighted mean), kl (weighted mean or None),
    acc (per position 1..B-1; NaN where no valid row), rows (valid rows), weights [N, B].
    """
    valid = labels != IGNORE
    ce, correct = row_stats(student_hidden, lm_head_weight, labels)
    weights = position_weights(weighting, valid, ce, alpha=streak_alpha, gamma=decay_gamma)
    kw = kl_weight if use_soft_labels else 0.0
    loss = loss_fn(student_hidden, teacher_hidden if use_soft_labels else None, lm_head_weight, labels, weights,
                   temperature=kl_temperature, kl_weight=kw, ignore_index=IGNORE)
    wsum = weights.sum().clamp_min(1e-12)
    ce_w = float((weights * ce).sum() / wsum)
    kl = None
    if kw > 0:
        kl = (float(loss.detach()) - (1 - kw) * ce_w) / (kw * kl_temperature ** 2)
    counts = valid[:, 1:].sum(0).float()
    acc = (correct[:, 1:].sum(0).float() / counts).tolist()  # NaN where a position has no valid row
    stats = {"ce": ce_w, "kl": kl, "acc": acc, "rows": int(valid.sum()), "weights": weights,
             "correct": correct[:, 1:].sum(0).tolist(), "count": counts.tolist()}
    return loss, stats
