"""The cached evaluator on a hybrid target (Qwen3.5/3.6 layout: Gated-DeltaNet + full attention)
against the uncached oracle (`cache=False`, `--no-cache`).

The cached session keeps each linear layer's recurrent and convolution state at the committed
position (a snapshot before the verify pass, the mixers re-run over the accepted tokens after it)
and crops the full-attention layers' keys and values. Its figures (tau, accepted counts per
position, drafts, committed tokens, generated output) must equal the oracle's exactly, greedy and
sampled at temperature 0.5 (this briefly trained target is flat, an untrained drafter flatter:
sharpened, they agree often enough that every acceptance length 0..B-1 occurs, so every rewind
depth and the all-accepted cycle are exercised). A second test holds the kept state itself to the state a
fresh pass over the committed tokens gives, after every cycle: a state advanced over a rejected
token fails it at the first rejection.
"""

import pytest
import torch
from flashfleet_trainer import hybrid_cache
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import CachedSession, speculative_tau
from flashfleet_trainer.sampling import Sampling, decode
from flashfleet_trainer.target import HiddenStateProducer

BLOCK = 4
LAYERS = 4  # linear, linear, linear, full


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.filterwarnings("error::FutureWarning")]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A tiny Qwen3.5-layout target, trained briefly (peaked enough that greedy is not a tie-break
    contest), saved as the real checkpoints are, and three prompts from its phrase language."""
    from flashfleet_trainer.tiny import PhraseLanguage, make_hybrid_target, save_wrapped, train_target

    lang = PhraseLanguage(96, seed=0)
    model, cfg = make_hybrid_target(96, 32, LAYERS, seed=0)
    train_target(model, lang, steps=25, batch=16, seq_len=32, log=lambda s: None)
    out = tmp_path_factory.mktemp("hybrid_eval")
    save_wrapped(model, cfg, out, seed=0)
    producer = HiddenStateProducer(out, ["cpu"], [1, 2], "cpu")
    prompts = [lang.sample(n).tolist() for n in (6, 9, 13)]
    return producer, prompts


def _drafter(producer, seed=0):
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_target(producer.config, num_draft_layers=2, target_layer_ids=[1, 2], block_size=BLOCK,
                                    mask_token_id=producer.config.vocab_size - 1)
    return DFlashDrafter(cfg).eval()


def _both(producer, drafter, prompts, **kw):
    out = []
    for cache in (False, True):
        trace = []
        res = speculative_tau(producer, drafter, prompts, BLOCK, 20, trace=trace, cache=cache, **kw)
        assert res.pop("cached") is cache
        out.append((res, trace))
    return out


def test_a_hybrid_target_runs_cached(hybrid):
    producer, _ = hybrid
    assert hybrid_cache.linear_layer_ids(producer.config) == [0, 1, 2]
    assert CachedSession.supported(producer)


def test_cached_greedy_equals_the_oracle_on_a_hybrid_target(hybrid):
    producer, prompts = hybrid
    (ru, tu), (rc, tc) = _both(producer, _drafter(producer), prompts)
    assert [t["output"] for t in tc] == [t["output"] for t in tu]
    assert tc == tu and rc == ru  # drafts, committed per cycle, accept counts, cycles, tau
    assert ru["cycles"] >= len(prompts) * 20 // BLOCK


@pytest.mark.parametrize("seed", [3, 11])
def test_cached_sampling_equals_the_oracle_at_every_acceptance_length(hybrid, seed):
    producer, prompts = hybrid
    (ru, tu), (rc, tc) = _both(producer, _drafter(producer, seed), prompts, sampling=Sampling(0.5, 1.0), seed=seed)
    assert tc == tu and rc == ru
    lengths = {n for t in tu for n in t["committed"]}
    assert lengths == set(range(1, BLOCK + 1)), lengths  # every rewind depth, and the all-accepted cycle


class _Checked(CachedSession):
    """After every commit, the kept linear states and the attention length against a fresh
    cached pass over the committed tokens alone."""

    checks = 0

    def start(self, prompt):
        self.tokens = list(prompt)
        return super().start(prompt)

    def verify(self, anchor_token, drafts):
        self.block = [anchor_token, *drafts]
        return super().verify(anchor_token, drafts)

    def commit(self, n):
        super().commit(n)
        self.tokens += self.block[:n]
        from transformers import DynamicCache

        fresh = DynamicCache(config=self.producer.config)
        self.producer.forward(torch.tensor([self.tokens]), replica=0, past_key_values=fresh)
        assert self.cache.get_seq_length() == len(self.tokens) == self.n
        for i in hybrid_cache.linear_layer_ids(self.producer.config):
            kept, ref = self.cache.layers[i], fresh.layers[i]
            torch.testing.assert_close(kept.conv_states[0], ref.conv_states[0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(kept.recurrent_states[0], ref.recurrent_states[0], rtol=1e-4, atol=1e-5)
        type(self).checks += 1


def test_the_kept_state_is_the_committed_tokens_state_after_every_cycle(hybrid):
    producer, prompts = hybrid
    drafter = _drafter(producer, 3)
    session = _Checked(producer, drafter, drafter.config.mask_token_id)
    gen = torch.Generator().manual_seed(3)
    committed = []
    for prompt in prompts:
        record = {}
        decode(session, prompt, 12, BLOCK, Sampling(0.5, 1.0), gen, record)
        committed += record["committed"]
    assert _Checked.checks == len(committed)
    assert min(committed) < BLOCK  # rejections happened: the rewind was exercised, not only full acceptance
