"""Speculative decoding's draft-verify loop and its acceptance rule, greedy or sampled.

One cycle: the drafter proposes B-1 tokens for the positions after the anchor (the last committed
token) in one pass; the target scores [anchor, drafts] in one pass, which gives its distribution
p_k for every drafted position and p_{B-1} for the one after the last draft.

Greedy (temperature 0): the longest prefix of drafts equal to the target's argmax is accepted,
then the target's argmax at the first mismatch (or after the last draft) is the bonus token.

Sampling (temperature T > 0, top-p, top-k): the standard speculative-sampling rule (Leviathan
et al. 2023; Chen et al. 2023). Draft k is sampled from the drafter's q_k; it is accepted with
probability min(1, p_k(x) / q_k(x)); at the first rejection the committed token is sampled from
norm(max(0, p_k - q_k)) and the cycle ends; when all B-1 are accepted the bonus is sampled from
p_{B-1}. Every committed token is then distributed exactly as the target's own sampling. The
sampling distribution is z-lab's `dflash` 0.1.0 protocol (`spec_generate(..., temperature,
top_p, top_k)`): logits / T, the top-k kept, softmax, then the smallest nucleus of mass top_p
among them; plain DFlash applies it to the drafter's logits as to the target's. Any q works for
the rule as long as each draft was drawn from the q the rule is given.

Greedy drafts while sampling (`draft_sample_method` greedy, vLLM 0.32.0's default): each draft
is the drafter's most likely token and q_k is one-hot on it, so draft k is accepted with probability
p_k(x) and a rejection samples from p_k without x; the committed tokens still follow the target's
sampling. The probabilistic default is z-lab's protocol; vLLM serves the greedy one unless its
speculative config says `draft_sample_method: probabilistic`, and its acceptance length at T > 0
is then lower (docs/benchmarks.md), so an evaluation says which it measured.

Which q: plain DFlash drafts all positions in one pass, so q_k does not depend on the other
drafts. DFlash 2 (`walk`) draws position k among the top-k candidates of the drafter's logits,
scored given the token chosen at k-1, so q_k is the softmax of those scores at T over the
candidates (0 elsewhere), conditional on the earlier drafts; the rule needs exactly that, since
draft k is only ever judged after drafts 1..k-1 were accepted.

The loop reads the target and the drafter through a session (`start`, `propose`, `verify`,
`commit`), so the evaluator's cached and uncached sessions and the tests' toy Markov pair run the
same code.
"""

from dataclasses import dataclass, field

import torch
from flashfleet.plan.defaults import DRAFT_SAMPLE_METHODS


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: the smallest top set whose mass reaches top_p (1 = all)
    top_k: int = 0  # only the k most likely tokens (0 = all)
    draft_sample_method: str = DRAFT_SAMPLE_METHODS[0]  # when sampling: drafts drawn from q, or its argmax

    def __post_init__(self):
        if not (self.temperature >= 0 and 0 < self.top_p <= 1 and self.top_k >= 0
                and self.draft_sample_method in DRAFT_SAMPLE_METHODS):
            raise ValueError(f"temperature {self.temperature} must be >= 0, top_p {self.top_p} in (0, 1], "
                             f"top_k {self.top_k} >= 0 and draft_sample_method {self.draft_sample_method!r} "
                             f"one of {', '.join(DRAFT_SAMPLE_METHODS)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def greedy_drafts(self) -> bool:
        """Sampling with each draft the drafter's argmax (q one-hot on it)."""
        return not self.greedy and self.draft_sample_method == "greedy"

    def record(self) -> dict:
        """The settings as every tau is recorded with them (contract.metrics.EVAL_SETTINGS)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "draft_sample_method": self.draft_sample_method}


GREEDY = Sampling()


def probs(logits, s: Sampling):
    """logits [N, V] -> the sampling distributions [N, V] (fp32): logits / T, the top-k kept (the
    rest -inf), softmax, then top-p (tokens outside the nucleus get 0, the rest renormalised)."""
    scores = logits.float() / s.temperature
    if 0 < s.top_k < scores.shape[-1]:
        top, idx = scores.topk(s.top_k, dim=-1)
        scores = torch.full_like(scores, float("-inf")).scatter_(-1, idx, top)
    p = torch.softmax(scores, dim=-1)
    if s.top_p < 1:
        sp, idx = p.sort(dim=-1, descending=True)
        outside = sp.cumsum(-1) - sp >= s.top_p  # the mass before this token already reaches top_p
        p = torch.zeros_like(p).scatter_(-1, idx, sp.masked_fill(outside, 0.0))
        p = p / p.sum(-1, keepdim=True)
    return p


def _draw(p, gen) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def first_token(logits, s: Sampling, gen) -> int:
    """The target's own token after the prompt, from its logits [V]."""
    return int(logits.argmax()) if s.greedy else _draw(probs(logits[None], s)[0], gen)


def propose(draft_logits, s: Sampling, gen):
    """Plain DFlash: (B-1 draft tokens, their distributions q [B-1, V] or None when greedy)."""
    if s.greedy:
        return draft_logits.argmax(-1).tolist(), None
    if s.greedy_drafts:
        drafts = draft_logits.argmax(-1)
        return drafts.tolist(), torch.nn.functional.one_hot(drafts, draft_logits.shape[-1]).float()
    q = probs(draft_logits, s)
    return torch.multinomial(q, 1, generator=gen)[:, 0].tolist(), q


def walk(selector, hidden, draft_logits, anchor: int, s: Sampling, gen):
    """DFlash 2: (B-1 draft tokens, q [B-1, V] or None when greedy), drafted as vLLM 0.32.0's
    DFlash2Speculator and z-lab's CandidateSelector.select do. hidden [B-1, H]: the drafter's
    normed output at the drafted positions; draft_logits [B-1, V] from it. At each position the
    candidates are the top `selector.top_k` tokens of the logits (the unary scores), and a
    candidate's score is its logit plus the selector's transition score given its predecessor:
    the anchor at the first position, the token chosen at the one before after that. vLLM scores
    every (predecessor candidate, candidate) pair first ([B-1, K, K], the first position's rows
    all the anchor) and then walks them; so does this. Greedy (or greedy drafts) takes each
    position's best score (q one-hot on it); sampling draws from softmax(scores / T) over the
    candidates, which is q (both engines apply neither top-p nor top-k to the scores: those shape
    the target's p only)."""
    k = selector.top_k
    unary, cand = draft_logits.float().topk(k, dim=-1)  # [B-1, K]
    n = cand.shape[0]
    prev = torch.cat([torch.full((1, k), anchor, dtype=cand.dtype, device=cand.device), cand[:-1]])  # [B-1, K]
    pair = selector.transition_scores(hidden[:, None, :].expand(n, k, hidden.shape[-1]), prev,
                                      cand[:, None, :].expand(n, k, k))  # [B-1, K prev, K]
    scores = unary[:, None, :] + pair.float()
    drafts, q = [], None if s.greedy else torch.zeros_like(draft_logits, dtype=torch.float32)
    i = 0  # the chosen predecessor's index among the previous candidates (any row at position 0)
    for pos in range(n):
        row = scores[pos, i]
        if s.greedy:
            i = int(row.argmax())
        elif s.greedy_drafts:
            i = int(row.argmax())
            q[pos, cand[pos, i]] = 1.0
        else:
            qk = torch.softmax(row / s.temperature, dim=-1)
            i = _draw(qk, gen)
            q[pos].scatter_(0, cand[pos], qk)  # top-k candidates are distinct tokens
        drafts.append(int(cand[pos, i]))
    return drafts, q


def accept(drafts, q, target_logits, s: Sampling, gen):
    """(n accepted drafts, the token committed after them). target_logits [B, V]: row k scores the
    token after [anchor, drafts[:k]]."""
    b1 = len(drafts)
    if s.greedy:
        g = target_logits.argmax(-1).tolist()
        n = 0
        while n < b1 and drafts[n] == g[n]:
            n += 1
        return n, g[n]
    p = probs(target_logits, s)
    rows, x = torch.arange(b1, device=p.device), torch.tensor(drafts, device=p.device)
    u = torch.rand(b1, generator=gen, device=p.device)
    # accept x_k with probability min(1, p/q): u < p/q, written without a division (q(x) > 0
    # because x was drawn from q)
    ok = (u * q[rows, x] < p[rows, x]).tolist() + [False]
    n = ok.index(False)
    if n == b1:
        return n, _draw(p[n], gen)
    residual = (p[n] - q[n]).clamp(min=0)
    if float(residual.sum()) <= 0:  # p == q up to rounding: a rejection then has probability ~0
        residual = p[n]
    return n, _draw(residual, gen)


@dataclass
class Stats:
    """Counts over cycles: per block position k = 1..B-1, how often a cycle reached it (every
    earlier draft accepted) and how often its draft was accepted."""

    block_size: int
    tokens: int = 0  # committed in cycles (bonus included; the first token after the prompt is not)
    cycles: int = 0
    reached: list = field(default_factory=list)
    accepted: list = field(default_factory=list)

    def __post_init__(self):
        self.reached = self.reached or [0] * (self.block_size - 1)
        self.accepted = self.accepted or [0] * (self.block_size - 1)

    def add_cycle(self, n: int):
        self.tokens += n + 1
        self.cycles += 1
        for k in range(min(n + 1, self.block_size - 1)):
            self.reached[k] += 1
        for k in range(n):
            self.accepted[k] += 1

    def add(self, other: "Stats"):
        self.tokens += other.tokens
        self.cycles += other.cycles
        self.reached = [a + b for a, b in zip(self.reached, other.reached, strict=True)]
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted, strict=True)]

    @property
    def tau(self) -> float:
        return self.tokens / max(1, self.cycles)

    def accept_rate(self) -> list:
        """Per position 1..B-1: accepted / reached (None where no cycle reached it)."""
        return [a / r if r else None for a, r in zip(self.accepted, self.reached, strict=True)]


def decode(session, prompt, max_new_tokens, block_size, s: Sampling, gen, record=None) -> Stats:
    """Speculative decoding of one prompt until at least max_new_tokens are committed in cycles.
    With a dict `record`: `drafts` (each cycle's proposals), `committed` (tokens per cycle) and
    `output` (generated tokens, the target's first token included) are filled in."""
    stats = Stats(block_size)
    anchor = first_token(session.start(prompt), s, gen)
    output, drafts_log, committed = [anchor], [], []
    while stats.tokens < max_new_tokens:
        drafts, q = session.propose(anchor, s, gen)
        n, nxt = accept(drafts, q, session.verify(anchor, drafts), s, gen)
        session.commit(n + 1)  # the anchor and the n accepted drafts are now context
        output += drafts[:n] + [nxt]
        anchor = nxt
        stats.add_cycle(n)
        drafts_log.append(drafts)
        committed.append(n + 1)
    if record is not None:
        record.update(drafts=drafts_log, committed=committed, output=output)
    return stats
