"""DFlash 2: the DFlash drafter plus two small modules (`--drafter-kind dflash2`).

1. A grouped dynamic causal convolution around each attention and MLP sublayer of every draft
   layer (`GroupedDynamicConv`): before the sublayer its input, after it its output, is mixed with
   the rows before it in the same block,

       y[r] = sum_t (base[t] + delta[r, t, g]) * x[r - t]     for taps t <= r % block_size,

   base [taps, H] learned per channel, delta [taps, G] projected from the sublayer's input row and
   shared by the conv_group_size channels of group g (one projection gives both sides' deltas).
   Positions are block positions: row % block_size of rows laid out block after block, so a tap
   never reaches into the previous block (speculators 0.9.0 `grouped_dynamic_conv`; vLLM 0.32.0
   `row % (num_speculative_tokens + 1)`, which is why vLLM must serve with num_speculative_tokens
   = block_size - 1). Identity at init (base tap 0 = 1, the rest and the projection 0): an
   untrained DFlash 2 backbone computes exactly what DFlash does.

2. A low-rank pairwise candidate selector (`CandidateSelector`): at each block position the unary
   top-k tokens of the drafter's logits are rescored as

       score(c) = unary(c) + < P[prev] * (W h), S[c] >

   with codebooks P, S [vocab, rank], W [rank, H], h the drafter's final normed row and prev the
   token chosen at the position before (the anchor for position 1). Serving walks the block
   left to right, taking the best-scored candidate at each position.

Training (`selector_loss`) follows speculators 0.9.0 (models/dflash2/metrics.py
`selector_training_candidates`, `compute_selector_loss`; models/dflash2/core.py `forward`):
loss = unary loss + alpha * selector loss, the selector loss a K-way CE over each row's unary
top-k with the label injected at rank K when absent, prev teacher-forced (the data's previous
token), the unary loss's position weights. The unary scores of the K candidates are hidden . E[c]
for the frozen head E (`candidate_logits`, its gradient to the hidden rows only); only choosing
the top k needs logits over the vocabulary: the trainer takes them from the unary loss's own
logits pass (`drafter_loss(top_k=...)`), `unary_top_k` is the standalone way (no gradient, in row
chunks).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .defaults import DFLASH2
from .loss import IGNORE

try:  # Triton: CUDA installs; CPU-only ones keep the torch version
    from flashfleet_kernels.candidate_logits import candidate_logits as candidate_logits_kernel
except ImportError:  # pragma: no cover - exercised only where triton is missing
    candidate_logits_kernel = None

# DrafterConfig's DFlash 2 fields (None for a DFlash drafter), named as the export's dflash_config names them
SHAPE = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def dflash2_problem(hidden_size: int, block_size: int, vocab_size: int, conv_kernel_size: int,
                    conv_group_size: int, selector_top_k: int, name=None) -> tuple[str, str] | None:
    """(what, fix) of a DFlash 2 shape the peers refuse (speculators, z-lab, vLLM), or None. `name`
    spells a setting for the message (default: its dflash-train flag)."""
    name = name or (lambda k: "--" + k.replace("_", "-"))
    if hidden_size % conv_group_size:
        fits = next(g for g in (16, 8, 4, 2, 1) if hidden_size % g == 0)
        return (f"{name('conv_group_size')} {conv_group_size} does not divide the hidden size {hidden_size}",
                f"use a conv group size that divides it, e.g. {fits}")
    if conv_kernel_size > block_size:
        return (f"{name('conv_kernel_size')} {conv_kernel_size} exceeds the block size {block_size}: a tap would "
                "reach across the block", f"use at most {block_size} taps, e.g. "
                f"{min(DFLASH2['conv_kernel_size'], block_size)}")
    if selector_top_k > vocab_size:
        return (f"{name('selector_top_k')} {selector_top_k} exceeds the vocabulary of {vocab_size}",
                f"use a selector top-k of at most {vocab_size}, e.g. {min(DFLASH2['selector_top_k'], vocab_size)}")
    return None


def grouped_conv(x, delta, base, block_size: int):
    """y [M, H] = sum_t (base[t] + delta[:, t, group]) * x shifted down by t rows, tap t only at
    block positions >= t. x [M, H] (whole blocks, one after another), delta [M, taps, G], base
    [taps, H]. In x's dtype, as vLLM's CUDA kernel accumulates in fp32 and stores in it."""
    m, h = x.shape
    taps, groups = delta.shape[-2], delta.shape[-1]
    xg = x.reshape(m, groups, h // groups)
    coef = base.to(x.dtype).view(taps, groups, h // groups)
    delta = delta.to(x.dtype)
    pos = torch.arange(m, device=x.device) % block_size
    y = xg * (coef[0] + delta[:, 0, :, None])
    for t in range(1, taps):
        prev = F.pad(xg[:-t], (0, 0, 0, 0, t, 0))  # row r - t, zeros before the first row
        keep = (pos >= t).to(x.dtype)[:, None, None]  # not across the block's start
        y = y + prev * (coef[t] + delta[:, t, :, None]) * keep
    return y.reshape(m, h)


class GroupedDynamicConv(nn.Module):
    """The convolution pair around one sublayer: `prepare` convolves its input and returns the
    output side's delta, `finish` convolves its output with it; `conv` is grouped_conv, or what
    drafter._grouped_conv picks on CUDA (flashfleet_kernels' Triton kernels). Names and shapes are
    the format's (layers.N.attention_conv.base_kernel [2, taps, H], ...kernel_projection.weight
    [2*taps*G, H])."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int, block_size: int):
        super().__init__()
        self.kernel_size, self.groups, self.block_size = kernel_size, hidden_size // group_size, block_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        """Identity: tap 0 = 1, every other tap and the dynamic part 0."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, x, conv=grouped_conv):
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.kernel_size, self.groups)
        return conv(x, delta[:, 0], self.base_kernel[0], self.block_size), delta[:, 1]

    def finish(self, y, delta, conv=grouped_conv):
        return conv(y, delta, self.base_kernel[1], self.block_size)


class CandidateSelector(nn.Module):
    """The pairwise rescoring of each position's unary top-k (module docstring, 2). `top_k`: the
    candidates per position. Names and shapes are the format's (candidate_selector.*)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int, std: float = 0.02):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        for w in (self.predecessor_codebook, self.successor_codebook, self.hidden_projection.weight):
            nn.init.normal_(w, std=std)  # speculators' initializer_range

    def transition_scores(self, hidden, predecessor_ids, candidate_ids):
        """[..., K] <P[prev] * (W h), S[c]> for hidden [..., H], predecessor_ids [...], candidate_ids
        [..., K]; in the codebooks' dtype (fp32 in training: elementwise, not an autocast matmul).
        The rows are gathered by F.embedding, whose backward sums a repeated id's gradients in
        segments; indexing's backward (index_put_ accumulating) walks each id's repeats in turn, and
        a trained drafter's candidates repeat the common tokens in most rows: with Zipf-distributed
        ids at the 27B shape it took 16x F.embedding's time (docs/benchmarks.md)."""
        context = F.embedding(predecessor_ids, self.predecessor_codebook) * self.hidden_projection(hidden).to(
            self.predecessor_codebook.dtype)
        return (F.embedding(candidate_ids, self.successor_codebook) * context.unsqueeze(-2)).sum(-1)

    def scores(self, unary_at_candidates, hidden, predecessor_ids, candidate_ids):
        """[..., K] the candidates' unary logits plus their transition scores (in the unary dtype)."""
        t = self.transition_scores(hidden, predecessor_ids, candidate_ids)
        return unary_at_candidates + t.to(unary_at_candidates.dtype)


# ---- training -------------------------------------------------------------------------------------

TOPK_CHUNK_ELEMENTS = 1 << 26  # logits per chunk of unary_top_k (256 MiB in fp32)
GATHER_CHUNK_ELEMENTS = 1 << 26  # gathered head elements per chunk of candidate_logits


@torch.no_grad()
def unary_top_k(hidden, head, k: int):
    """[R, k] the ids of the k largest logits hidden [R, H] @ head.T, best first: the only full-
    vocabulary pass DFlash 2 adds, without gradient, a chunk of rows at a time (never [R x vocab]
    whole). One function so a kernel can replace it."""
    h = hidden.to(head.dtype)
    step = max(1, TOPK_CHUNK_ELEMENTS // head.shape[0])
    return torch.cat([(h[i:i + step] @ head.T).topk(k, dim=-1).indices for i in range(0, h.shape[0], step)])


class _CandidateLogits(torch.autograd.Function):
    """hidden [R, H] . head[ids] [R, K, H] -> [R, K] fp32, in row chunks, the products in the head's
    dtype with fp32 accumulation (bf16 on CUDA: the precision of the unary loss's own logits, and
    no fp32 copy of the gathered [R, K, H] rows); the head is frozen, so the backward gives the
    hidden rows' gradient only, gathering the head rows again instead of keeping [R, K, H] for it."""

    @staticmethod
    def forward(ctx, hidden, head, ids):
        ctx.save_for_backward(hidden, head, ids)
        step = max(1, GATHER_CHUNK_ELEMENTS // (ids.shape[1] * head.shape[1]))
        h = hidden.to(head.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            return torch.cat([torch.bmm(head[ids[i:i + step]], h[i:i + step].unsqueeze(-1)).squeeze(-1).float()
                              for i in range(0, hidden.shape[0], step)])

    @staticmethod
    def backward(ctx, grad):
        hidden, head, ids = ctx.saved_tensors
        step = max(1, GATHER_CHUNK_ELEMENTS // (ids.shape[1] * head.shape[1]))
        g = grad.to(head.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            dh = torch.cat([torch.bmm(g[i:i + step].unsqueeze(1), head[ids[i:i + step]]).squeeze(1)
                            for i in range(0, hidden.shape[0], step)])
        return dh.to(hidden.dtype), None, None


def candidate_logits(hidden, head, ids):
    """[R, K] fp32 unary logits hidden [R, H] @ head.T at ids [R, K], with gradient to hidden: on CUDA
    flashfleet_kernels' Triton kernels (the head's rows read in place, never gathered into [R, K, H]),
    else _CandidateLogits (their test oracle)."""
    if candidate_logits_kernel is not None and hidden.is_cuda and head.is_contiguous():
        return candidate_logits_kernel(hidden, head, ids)
    return _CandidateLogits.apply(hidden, head, ids)


def training_candidates(candidates, labels):
    """speculators' selector_training_candidates: (ids [R, K], label's index [R], label among the
    unary top-k [R]); where it is absent the label replaces the last (weakest) candidate."""
    k = candidates.shape[-1]
    hit = candidates == labels[:, None]
    contains = hit.any(-1)
    index = torch.where(contains, hit.to(torch.int64).argmax(-1), k - 1)
    ids = candidates.clone()
    ids[:, -1] = torch.where(contains, ids[:, -1], labels)
    return ids, index, contains


def selector_loss(selector, hidden, head, labels, predecessors, weights, candidates=None):
    """The selector's loss and statistics for one micro-batch's predicted rows (block positions
    1..B-1). hidden [N, P, H] the drafter's final normed rows; head [V, H] the target's frozen LM
    head; labels [N, P] the unary CE's labels (IGNORE where unsupervised); predecessors [N, P] the
    token before each row (the anchor at position 1); weights [N, P] the unary loss's position
    weights (0 where unsupervised); candidates [N, P, >= top_k] the rows' unary top-k ids, best
    first, where the unary loss already took them (else `unary_top_k` computes them). Returns
    (loss, stats): loss = sum w * CE_K / sum w, the same normalization as the unary loss; stats on
    the device, nothing read back: loss (detached), correct (teacher-forced picks equal to the
    label, counted where the label is among the unary top-k, as speculators counts its selector
    accuracy), found (rows whose label is among them), rows (supervised rows)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    valid = y != IGNORE
    target = torch.where(valid, y, torch.zeros_like(y))  # an unsupervised row's CE has weight 0
    top = (unary_top_k(h, head, selector.top_k) if candidates is None
           else candidates.reshape(h.shape[0], -1)[:, :selector.top_k])
    ids, index, contains = training_candidates(top, target)
    scores = selector.scores(candidate_logits(h, head, ids), h, predecessors.reshape(-1), ids)
    ce = F.cross_entropy(scores.float(), index, reduction="none")
    w = weights.reshape(-1).float()
    loss = (w * ce).sum() / w.sum().clamp_min(1e-12)
    found = contains & valid
    correct = (scores.detach().argmax(-1) == index) & found
    return loss, {"loss": loss.detach().double(), "correct": correct.sum().double(), "found": found.sum().double(),
                  "rows": valid.sum().double()}
