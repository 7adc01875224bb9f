"""dflash-eval drafts a DFlash 2 block as the engines do (sampling.walk, evaluate's sessions).

The reference is z-lab's `dflash` 0.1.0 `CandidateSelector.select` (the engine vLLM 0.32.0's
DFlash2Speculator agrees with: top-k of the drafter's logits, each candidate's logit plus its
transition score given the previous choice, the anchor first; greedy argmax, sampling from the
softmax of the scores at T, which is q). With the same weights the walk must choose the same
path, and when sampling give the same q at every position (z-lab's draws made to follow the
walk's path, so the two are compared on one path). The selector is the drafter's own
(dflash2.CandidateSelector) holding z-lab's weights. Then the evaluator: a `--drafter-kind dflash2`
drafter (its `selector` set) drafts by the walk, cached and uncached alike.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from flashfleet_trainer.dflash2 import CandidateSelector
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import CachedSession, UncachedSession, load_prompts, speculative_tau
from flashfleet_trainer.sampling import GREEDY, Sampling, propose, walk
from flashfleet_trainer.target import HiddenStateProducer
from transformers import AutoConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PEERS = Path(__file__).resolve().parents[2] / ".cache" / "peers"
V, H, RANK, K, L = 50, 16, 8, 4, 7


def _zlab():
    if not (PEERS / "dflash" / "model.py").is_file():
        pytest.skip(f"z-lab's dflash is not installed under {PEERS} (make venv installs requirements/peers.txt)")
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import dflash.model

    return dflash.model


def _ours(zl) -> CandidateSelector:
    """The drafter's selector with z-lab's selector's weights (the format's names)."""
    ours = CandidateSelector(zl.hidden_projection.in_features, zl.predecessor_codebook.num_embeddings,
                             zl.hidden_projection.out_features, zl.top_k)
    with torch.no_grad():
        ours.predecessor_codebook.copy_(zl.predecessor_codebook.weight)
        ours.successor_codebook.copy_(zl.successor_codebook.weight)
        ours.hidden_projection.weight.copy_(zl.hidden_projection.weight)
    return ours.eval()


def _pair(seed=0):
    zlab = _zlab()
    torch.manual_seed(seed)
    zl = zlab.CandidateSelector(SimpleNamespace(vocab_size=V, hidden_size=H, selector_rank=RANK,
                                                selector_top_k=K)).eval()
    hidden, logits = torch.randn(1, L, H), 3 * torch.randn(1, L, V)
    return zlab, zl, _ours(zl), hidden, logits


@torch.no_grad()
def test_greedy_walk_is_zlabs_path():
    for seed in range(5):
        zlab, zl, ours, hidden, logits = _pair(seed)
        path, _, q = zl.select(hidden, logits, torch.tensor([7]), 0.0)
        drafts, our_q = walk(ours, hidden[0], logits[0], 7, GREEDY, None)
        assert q is None and our_q is None
        assert drafts == path[0].tolist()
        # the selector moved the path somewhere: the walk is not the logits' argmax
        assert seed or drafts != logits[0].argmax(-1).tolist()


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_walk_has_zlabs_q(temperature, monkeypatch):
    zlab, zl, ours, hidden, logits = _pair(3)
    gen = torch.Generator().manual_seed(0)
    drafts, q = walk(ours, hidden[0], logits[0], 11, Sampling(temperature, 0.5, 2), gen)  # top-p/k: not on q
    zl_cands = torch.topk(logits, K, dim=-1, sorted=False).indices[0]  # the order select sees
    picks = iter([int((zl_cands[pos] == d).nonzero()) for pos, d in enumerate(drafts)])
    monkeypatch.setattr(zlab, "_sample_probs", lambda probs: torch.tensor([next(picks)]))
    path, cands, zq = zl.select(hidden, logits, torch.tensor([11]), temperature)
    assert path[0].tolist() == drafts
    full = torch.zeros(L, V).scatter_(1, cands[0], zq[0])
    torch.testing.assert_close(q, full)
    assert torch.allclose(q.sum(-1), torch.ones(L)) and ((q > 0).sum(-1) == K).all()


# ---- the evaluator's draft step --------------------------------------------------------------------

BLOCK = 4


@pytest.fixture(scope="module")
def setup(trainer_tiny):
    model = trainer_tiny / "model"
    producer = HiddenStateProducer(model, ["cpu"], [1, 2], "cpu")
    prompts = load_prompts(trainer_tiny / "data" / "eval" / "prompts.jsonl")
    tcfg = AutoConfig.from_pretrained(model, local_files_only=True)
    torch.manual_seed(0)
    cfg = DrafterConfig.from_target(tcfg, num_draft_layers=1, target_layer_ids=[1, 2], block_size=BLOCK,
                                    mask_token_id=tcfg.vocab_size - 1, drafter_kind="dflash2", conv_kernel_size=2,
                                    conv_group_size=16, selector_rank=RANK, selector_top_k=K)
    drafter = DFlashDrafter(cfg).eval()
    assert isinstance(drafter.selector, CandidateSelector)
    with torch.no_grad():  # an untrained selector scores ~0: make it strong enough to leave the logits' argmax
        for w in (drafter.selector.predecessor_codebook, drafter.selector.successor_codebook,
                  drafter.selector.hidden_projection.weight):
            w.normal_(0, 1)
    return producer, prompts, drafter


@torch.no_grad()
@pytest.mark.parametrize("session_cls", [UncachedSession, CachedSession])
def test_a_session_drafts_by_the_walk_when_the_drafter_has_a_selector(setup, session_cls):
    producer, prompts, drafter = setup
    session = session_cls(producer, drafter, drafter.config.mask_token_id)
    moved = False
    for prompt in prompts:
        anchor = int(session.start(prompt).argmax())
        hidden = session.draft_hidden(anchor)
        logits = hidden @ producer.lm_head_weight.t()
        want = walk(drafter.selector, hidden, logits, anchor, GREEDY, None)
        assert session.propose(anchor, GREEDY, None) == want
        moved |= want[0] != propose(logits, GREEDY, None)[0]
        s = Sampling(1.0, 0.9, 8)
        want = walk(drafter.selector, hidden, logits, anchor, s, torch.Generator().manual_seed(5))
        got = session.propose(anchor, s, torch.Generator().manual_seed(5))
        assert got[0] == want[0] and torch.equal(got[1], want[1])
    assert moved  # the selector changed some drafts: a session ignoring it would fail above


def test_cached_and_uncached_dflash2_evaluations_agree(setup):
    producer, prompts, drafter = setup
    for s in (GREEDY, Sampling(2.0)):
        out = []
        for cache in (False, True):
            trace = []
            res = speculative_tau(producer, drafter, prompts, BLOCK, 16, trace=trace, cache=cache, sampling=s, seed=3)
            out.append((res.pop("cached"), res, trace))
        (_, ru, tu), (_, rc, tc) = out
        assert tc == tu and rc == ru
