"""The KV-cached evaluator against the uncached one (the oracle, `cache=False` / `--no-cache`).

Both run the same draft-verify loop (sampling.decode) on the tiny target; the cached session feeds
the target only [anchor, drafts] on top of a DynamicCache cropped back after every rejection, and
the drafter only the block on top of its cached per-layer context K/V. They must propose the same
drafts, commit the same tokens and count the same cycles, exactly. Greedy with an untrained drafter
rejects almost every draft, so the sampled case at temperature 2 (target and drafter flattened:
every acceptance length 0..B-1 occurs) is what exercises cropping at every depth;
with one seed both paths draw the same random numbers, so any difference in the target's or the
drafter's numbers beyond rounding shows up as a different output.
"""

import json
from types import SimpleNamespace

import pytest
import torch
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import CachedSession, load_prompts, speculative_tau
from flashfleet_trainer.evaluate import main as eval_main
from flashfleet_trainer.sampling import Sampling
from flashfleet_trainer.target import HiddenStateProducer
from transformers import AutoConfig

BLOCK = 4


# the cache goes by the name the installed transformers takes (`compilation.cache_kwarg`), never a deprecated one
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.filterwarnings("error::FutureWarning")]


def _drafter(model_dir, layer_types=("full_attention", "full_attention"), window=None, seed=0):
    tcfg = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_target(tcfg, num_draft_layers=len(layer_types), target_layer_ids=[1, 2],
                                    block_size=BLOCK, mask_token_id=tcfg.vocab_size - 1,
                                    layer_types=",".join(layer_types), sliding_window=window)
    return DFlashDrafter(cfg).eval()


@pytest.fixture(scope="module")
def setup(trainer_tiny):
    model = trainer_tiny / "model"
    producer = HiddenStateProducer(model, ["cpu"], [1, 2], "cpu")
    prompts = load_prompts(trainer_tiny / "data" / "eval" / "prompts.jsonl")
    return producer, prompts, model


def _both(producer, drafter, prompts, **kw):
    out = []
    for cache in (False, True):
        trace = []
        res = speculative_tau(producer, drafter, prompts, BLOCK, 24, trace=trace, cache=cache, **kw)
        assert res["cached"] is cache
        out.append((res.pop("cached"), res, trace))
    return out


def test_cached_greedy_equals_uncached(setup):
    producer, prompts, model = setup
    (_, ru, tu), (_, rc, tc) = _both(producer, _drafter(model), prompts)
    assert [t["output"] for t in tc] == [t["output"] for t in tu]
    assert tc == tu and rc == ru  # drafts, committed per cycle, cycles, tau: all identical
    assert ru["cycles"] >= len(prompts) * 24 // BLOCK


@pytest.mark.parametrize("layer_types,window", [(("full_attention", "full_attention"), None),
                                                (("sliding_attention", "full_attention"), 5)])
def test_cached_sampling_equals_uncached_at_every_acceptance_length(setup, layer_types, window):
    producer, prompts, model = setup
    drafter = _drafter(model, layer_types, window)
    (_, ru, tu), (_, rc, tc) = _both(producer, drafter, prompts, sampling=Sampling(2.0, 1.0), seed=3)
    assert tc == tu and rc == ru
    lengths = {n for t in tu for n in t["committed"]}
    assert lengths == set(range(1, BLOCK + 1)), lengths  # every crop depth, and the all-accepted bonus


def test_a_hybrid_target_whose_linear_layers_are_not_known_runs_uncached():
    """Hybrid targets run cached (test_eval_hybrid_cache.py) when each linear layer is a decoder
    layer with a `linear_attn` mixer; one laid out otherwise falls back to the oracle."""
    from transformers import Qwen3_5TextConfig

    hybrid = Qwen3_5TextConfig(num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"])
    decoder = SimpleNamespace(layers=[SimpleNamespace(mixer=None) for _ in range(4)])
    producer = SimpleNamespace(config=hybrid, replicas=[("cpu", SimpleNamespace(get_decoder=lambda: decoder))])
    assert not CachedSession.supported(producer)
    decoder.layers[:3] = [SimpleNamespace(linear_attn=None) for _ in range(3)]
    assert CachedSession.supported(producer)


def test_dflash_eval_no_cache_prints_the_same(trainer_tiny, capsys):
    prompts = str(trainer_tiny / "data" / "eval" / "prompts.jsonl")
    common = ["--target-model", str(trainer_tiny / "model"), "--random-drafter", "--block-size", "4",
              "--num-draft-layers", "1", "--prompts", prompts, "--num-prompts", "2", "--max-new-tokens", "8"]
    printed = []
    for extra in ([], ["--no-cache"]):
        assert eval_main(common + extra) == 0
        printed.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert printed[0].pop("cached") is True and printed[1].pop("cached") is False
    assert printed[0] == printed[1]
