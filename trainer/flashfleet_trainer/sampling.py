"""Speculative decoding's draft-verify loop and its acceptance rule, greedy or sampled.

One cycle: the drafter proposes B-1 tokens for the positions after the anchor (the last committed
token) in one pass; the target scores [anchor, drafts] in one pass, which gives its distribution
p_k for every drafted position and p_{B-1} for the one after the last draft.

Greedy (temperature 0): the longest prefix of drafts equal to the target's argmax is accepted,
then the target's argmax at the first mismatch (or after the last draft) is the bonus token.

Sampling (temperature T > 0, top-p): the standard speculative-sampling rule (Leviathan et al.
2023; Chen et al. 2023). Draft k is sampled from the drafter's q_k; it is accepted with
probability min(1, p_k(x) / q_k(x)); at the first rejection the committed token is sampled from
norm(max(0, p_k - q_k)) and the cycle ends; when all B-1 are accepted the bonus is sampled from
p_{B-1}. Every committed token is then distributed exactly as the target's own sampling
(temperature, then top-p, applied to p and q alike). DFlash drafts all positions in one pass, so
q_k does not depend on the other drafts: each q_k is the distribution its token was drawn from,
which is all the rule needs.

The loop reads the target and the drafter through a session (`start`, `draft`, `verify`,
`commit`), so the evaluator's cached and uncached sessions and the tests' toy Markov pair run the
same code.
"""

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: the smallest top set whose mass reaches top_p (1 = all)

    def __post_init__(self):
        if not (self.temperature >= 0 and 0 < self.top_p <= 1):
            raise ValueError(f"temperature {self.temperature} must be >= 0 and top_p {self.top_p} in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def probs(logits, s: Sampling):
    """logits [N, V] -> the sampling distributions [N, V] (fp32): softmax(logits / T), then top-p
    (tokens outside the nucleus get 0, the rest renormalised)."""
    p = torch.softmax(logits.float() / s.temperature, dim=-1)
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
    """(B-1 draft tokens, their distributions q [B-1, V] or None when greedy)."""
    if s.greedy:
        return draft_logits.argmax(-1).tolist(), None
    q = probs(draft_logits, s)
    return torch.multinomial(q, 1, generator=gen)[:, 0].tolist(), q


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
        drafts, q = propose(session.draft(anchor), s, gen)
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
