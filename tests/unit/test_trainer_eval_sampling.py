"""The speculative-sampling rule keeps the target's distribution (sampling.decode, the evaluator's loop).

A toy pair with known distributions: the target is a Markov chain over V tokens (its logits for
the token after x are log P[x]); the drafter proposes block position k after anchor a from a
fixed Q[k, a], deliberately unlike P. Whatever the drafter does, the tokens the loop commits must
be distributed as the target's own sampling (temperature, top-k, then top-p: z-lab's protocol), so
the first three generated tokens must follow P's chain exactly: a chi-square test over the V^3
sequences (cells expected fewer than 5 times pooled into one) with a fixed seed, at p = 0.001.
The same test run with a broken rule (every draft accepted) must reject, so the test can fail.

The DFlash 2 pair drafts by the candidate walk (sampling.walk) with a low-rank selector of z-lab's
form, whose transition scores are strong enough to move the path: q is then the walk's
distribution over each position's candidates, conditional on the drafts before it. The same
chi-square holds, and fails when the rule is given the drafter's unary distribution instead.
"""

import itertools
import math
import sys

import pytest
import torch
from flashfleet_trainer import sampling
from flashfleet_trainer.sampling import Sampling, Stats, decode, probs, propose, walk

V, BLOCK, SAMPLES = 3, 3, 4000


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def chi2_critical(df, z=3.090):
    """The chi-square quantile at the normal quantile z (3.090: p = 0.001), Wilson-Hilferty."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


class ToyPair:
    """A session (start / draft / verify / commit) over a Markov target and a fixed drafter."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.target = torch.log(torch.rand(V, V, generator=g) + 0.05)  # [prev, next] logits
        self.draft_logits = 2 * torch.randn(BLOCK - 1, V, V, generator=g)  # [k, anchor, token]

    def start(self, prompt):
        return self.target[prompt[-1]]

    def propose(self, anchor, s, gen):
        return propose(self.draft_logits[:, anchor], s, gen)

    def verify(self, anchor, drafts):
        return self.target[torch.tensor([anchor, *drafts])]

    def commit(self, n):
        pass


class LowRankSelector:
    """A DFlash 2 candidate selector of z-lab's form: the transition score of candidate c after
    predecessor p at a position with drafter output h is (W h * P[p]) . S[c]."""

    def __init__(self, vocab, hidden, rank, top_k, scale=1.0, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.top_k = top_k
        self.proj = scale * torch.randn(hidden, rank, generator=g)
        self.pred = torch.randn(vocab, rank, generator=g)
        self.succ = torch.randn(vocab, rank, generator=g)

    def transition_scores(self, hidden, predecessor_ids, candidate_ids):
        left = (hidden @ self.proj) * self.pred[predecessor_ids]  # [..., R]
        return torch.einsum("...r,...kr->...k", left, self.succ[candidate_ids])


class ToyPair2(ToyPair):
    """The same target; the drafter is DFlash 2: per anchor a fixed output [B-1, H] and its logits,
    drafted by the walk over the top-2 of 3 tokens."""

    H = 4

    def __init__(self, seed=0):
        super().__init__(seed)
        g = torch.Generator().manual_seed(seed + 1)
        self.hidden = torch.randn(V, BLOCK - 1, self.H, generator=g)  # [anchor, k, H]
        self.selector = LowRankSelector(V, self.H, 3, top_k=2, scale=2.0, seed=seed)

    def propose(self, anchor, s, gen):
        return walk(self.selector, self.hidden[anchor], self.draft_logits[:, anchor], anchor, s, gen)


def _reference(logits, s):
    """The target's own sampling distribution per row, written out independently of sampling.probs:
    softmax(logits / T) over the top-k, then the smallest nucleus of mass top_p, renormalised."""
    rows = []
    for row in logits.tolist():
        order = sorted(range(len(row)), key=lambda t: -row[t])[:s.top_k or len(row)]
        z = [math.exp(row[t] / s.temperature) for t in order]
        mass, kept = 0.0, {}
        for t, w in zip(order, z, strict=True):
            if mass >= s.top_p:
                break
            kept[t] = w / sum(z)
            mass += w / sum(z)
        rows.append([kept.get(t, 0.0) / sum(kept.values()) for t in range(len(row))])
    return torch.tensor(rows)


def _expected(pair, s, x0):
    p = _reference(pair.target, s)
    return {seq: float(p[x0, seq[0]] * p[seq[0], seq[1]] * p[seq[1], seq[2]])
            for seq in itertools.product(range(V), repeat=3)}


def _chi2(pair, s, x0=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    counts = dict.fromkeys(itertools.product(range(V), repeat=3), 0)
    for _ in range(SAMPLES):
        rec = {}
        decode(pair, [x0], 2, BLOCK, s, gen, rec)
        counts[tuple(rec["output"][:3])] += 1
    exp = _expected(pair, s, x0)
    assert math.isclose(sum(exp.values()), 1.0, abs_tol=1e-5)
    cells = [(counts[k], SAMPLES * e) for k, e in exp.items() if SAMPLES * e >= 5]
    rest = (SAMPLES - sum(c for c, _ in cells), SAMPLES - sum(e for _, e in cells))
    cells += [rest] if rest[1] > 1e-9 else []
    chi2 = sum((c - e) ** 2 / e for c, e in cells)
    return chi2, chi2_critical(len(cells) - 1), counts, exp


def _accept_always(drafts, q, target_logits, s, gen):
    """The broken rule: every draft accepted, bonus from the target."""
    return len(drafts), int(torch.multinomial(probs(target_logits, s)[-1], 1, generator=gen))


@pytest.mark.parametrize("s,check_broken", [(Sampling(1.0, 1.0), True), (Sampling(0.7, 0.8), False),
                                            (Sampling(0.7, 0.9, 2), False)],
                         ids=["T1", "T0.7-top_p0.8", "T0.7-top_p0.9-top_k2"])
def test_speculative_sampling_keeps_the_target_distribution(s, check_broken, monkeypatch):
    pair = ToyPair()
    chi2, crit, counts, exp = _chi2(pair, s)
    assert chi2 < crit, (chi2, crit, counts)
    # top-p / top-k: sequences through a token outside some kept set have probability 0 and never occur
    assert all(counts[k] == 0 for k, e in exp.items() if e == 0)
    if s.top_k:  # top-k did cut: every sequence through a third token is out
        assert sum(e == 0 for e in exp.values()) >= V ** 3 - 2 ** 3
    if check_broken:  # the same test rejects a rule that accepts every draft
        monkeypatch.setattr(sampling, "accept", _accept_always)
        broken, crit, _, _ = _chi2(pair, s)
        assert broken > 10 * crit, broken


def _walk_with_unary_q(selector, hidden, draft_logits, anchor, s, gen):
    """A broken DFlash 2 draft step: the walk's drafts, but q from the drafter's logits alone."""
    drafts, _ = sampling.walk(selector, hidden, draft_logits, anchor, s, gen)
    return drafts, probs(draft_logits, s)


@pytest.mark.parametrize("s", [Sampling(1.0), Sampling(0.7, 0.9, 2)], ids=["T1", "T0.7-top_p0.9-top_k2"])
def test_dflash2_walk_keeps_the_target_distribution(s, monkeypatch):
    """The walk's q over the candidates, conditional on the earlier drafts, is what the rule needs."""
    pair = ToyPair2()
    chi2, crit, counts, exp = _chi2(pair, s)
    assert chi2 < crit, (chi2, crit, counts)
    assert all(counts[k] == 0 for k, e in exp.items() if e == 0)
    if s == Sampling(1.0):  # the same test rejects the unary q
        monkeypatch.setattr(sys.modules[__name__], "walk", _walk_with_unary_q)
        broken, crit, _, _ = _chi2(pair, s)
        assert broken > 3 * crit, broken


GREEDY_DRAFTS = [Sampling(1.0, draft_sample_method="greedy"), Sampling(0.7, 0.9, 2, "greedy")]


@pytest.mark.parametrize("pair_kind", [ToyPair, ToyPair2], ids=["dflash", "dflash2"])
@pytest.mark.parametrize("s", GREEDY_DRAFTS, ids=["T1", "T0.7-top_p0.9-top_k2"])
def test_greedy_drafts_keep_the_target_distribution(pair_kind, s):
    """vLLM's default while sampling: each draft the drafter's argmax (the walk's best path for
    DFlash 2), q one-hot on it. The committed tokens still follow the target's own sampling."""
    chi2, crit, counts, exp = _chi2(pair_kind(), s)
    assert chi2 < crit, (chi2, crit, counts)
    assert all(counts[k] == 0 for k, e in exp.items() if e == 0)


def test_a_greedy_draft_is_accepted_with_the_targets_probability_of_it():
    """With greedy drafts the first draft after anchor y is argmax Q[0, y], accepted with probability
    P(y -> that token) (vLLM's rejection sampler with one-hot draft probabilities). One cycle after
    prompt [a], whose anchor y the target samples first: the rate is sum_y P(a -> y) P(y -> argmax
    Q[0, y]), observed within 4 binomial standard deviations, and far from the probabilistic drafts'."""
    pair, a = ToyPair(seed=2), 1
    target = probs(pair.target, Sampling(1.0))  # [prev, next]
    p = sum(float(target[a, y] * target[y, int(pair.draft_logits[0, y].argmax())]) for y in range(V))
    rates = {}
    for method in ("greedy", "probabilistic"):
        gen, st = torch.Generator().manual_seed(0), Stats(BLOCK)
        for _ in range(SAMPLES):
            st.add(decode(pair, [a], 1, BLOCK, Sampling(1.0, draft_sample_method=method), gen))
        rates[method] = st.accept_rate()[0]
    assert abs(rates["greedy"] - p) < 4 * math.sqrt(p * (1 - p) / SAMPLES), (rates, p)
    assert abs(rates["probabilistic"] - p) > 0.05, (rates, p)


def test_greedy_commits_the_target_greedy_chain():
    pair = ToyPair(seed=1)
    rec = {}
    stats = decode(pair, [2], 12, BLOCK, Sampling(), None, rec)
    chain, x = [], 2
    for _ in range(len(rec["output"])):
        x = int(pair.target[x].argmax())
        chain.append(x)
    assert rec["output"] == chain
    assert stats.tokens == sum(rec["committed"]) and stats.cycles == len(rec["committed"])


def test_top_p_keeps_the_smallest_nucleus():
    p = probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), Sampling(1.0, 0.8))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_top_k_comes_before_top_p():
    """z-lab's order: the top-k renormalised first, then the nucleus among them. Top-2 of
    [0.5, 0.3, 0.15, 0.05] is [0.625, 0.375]; its 0.6-nucleus is the first token alone (top-p
    first would have kept two)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(probs(logits, Sampling(1.0, 0.6, 2)), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(probs(logits, Sampling(1.0, 1.0, 2)), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(probs(logits, Sampling(1.0, 1.0, 4)), torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def test_stats_tau_and_per_position_acceptance():
    st = Stats(4)
    for n in (0, 3, 1):  # cycles accepting 0, all 3, and 1 draft
        st.add_cycle(n)
    assert st.tau == (1 + 4 + 2) / 3
    assert st.reached == [3, 2, 1] and st.accepted == [2, 1, 1]
    assert st.accept_rate() == [2 / 3, 0.5, 1.0]
    with pytest.raises(ValueError):
        Sampling(-1.0)
    with pytest.raises(ValueError):
        Sampling(1.0, 1.0, -1)
    with pytest.raises(ValueError, match="draft_sample_method 'argmax' one of probabilistic, greedy"):
        Sampling(1.0, draft_sample_method="argmax")
