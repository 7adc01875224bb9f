"""DFlash 2's defaults (docs/trainer.md, "DFlash 2"): what flags leave unset on a `--drafter-kind
dflash2` run is the published DFlash 2 shape on a hybrid Qwen3.5/3.6/3.8 target (z-lab's
Qwen3.8-27B-DFlash2 config.json: every layer sliding_attention with window 2048, not causal in the
block, block size 8, target layers 5, 19, 33, 47, 61 of 64), speculators' elsewhere; explicit flags
still win, and DFlash's defaults do not move."""

import json

import pytest
from flashfleet_trainer import preflight as pf
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.drafter import DrafterConfig, drafter_defaults
from flashfleet_trainer.target import default_target_layers, run_target_layers
from transformers import AutoConfig

from tests.unit.test_qwen35_check import (  # noqa: F401
    QWEN36_27B,
    _argv,
    data_dir,
    fake_wrapped_checkpoint,
    no_weights_read,  # noqa: F401
)

PUBLISHED_IDS = [5, 19, 33, 47, 61]  # z-lab/Qwen3.8-27B-DFlash2's dflash_config.target_layer_ids


def _text(config: dict):
    return AutoConfig.for_model(**config).text_config


def test_a_hybrid_targets_dflash2_drafter_is_all_sliding_and_dflash_keeps_its_full_layer():
    t = _text(QWEN36_27B)
    assert drafter_defaults(t, 5, "dflash2")["layer_types"] == ["sliding_attention"] * 5
    assert drafter_defaults(t, 5)["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    d2 = DrafterConfig.from_target(t, num_draft_layers=5, target_layer_ids=PUBLISHED_IDS, block_size=8,
                                   mask_token_id=248070, drafter_kind="dflash2")
    assert d2.sliding_window == 2048 and d2.sliding_window_non_causal
    d1 = DrafterConfig.from_target(t, num_draft_layers=5, target_layer_ids=PUBLISHED_IDS, block_size=16,
                                   mask_token_id=248070)
    assert not d1.sliding_window_non_causal  # DFlash's sliding layers stay causal in the block
    # a DFlash 2 drafter without sliding layers has nothing to make non-causal
    full = DrafterConfig.from_target(t, num_draft_layers=5, target_layer_ids=PUBLISHED_IDS, block_size=8,
                                     mask_token_id=248070, drafter_kind="dflash2", layer_types="full*5")
    assert full.layer_types == ["full_attention"] * 5 and not full.sliding_window_non_causal


def test_the_published_target_layers_where_they_were_published_and_dflashs_rule_elsewhere():
    t = _text(QWEN36_27B)  # 64 layers, the Qwen3.8-27B architecture
    assert run_target_layers(t, 5, "dflash2") == PUBLISHED_IDS
    assert run_target_layers(t, 5) == default_target_layers(64, 5) == [1, 16, 31, 46, 61]
    assert run_target_layers(t, 4, "dflash2") == default_target_layers(64, 4)  # no published 4-layer ids
    qwen3 = AutoConfig.for_model("qwen3", num_hidden_layers=64)  # not hybrid: nothing published for it
    assert run_target_layers(qwen3, 5, "dflash2") == default_target_layers(64, 5)


def test_block_size_follows_the_kind_unless_given(tmp_path):
    base = ["--target-model", "/m", "--data-dir", "/d", "--output-dir", "/o"]
    assert parse_args(base).block_size == 16
    assert parse_args([*base, "--drafter-kind", "dflash2"]).block_size == 8
    assert parse_args([*base, "--drafter-kind", "dflash2", "--block-size", "16"]).block_size == 16
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"drafter_kind": "dflash2", "block_size": 12}))
    assert parse_args([*base, "--config", str(path)]).block_size == 12


def test_check_on_the_27b_shape_derives_the_published_dflash2_drafter(tmp_path, data_dir, no_weights_read):  # noqa: F811
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.8-27B", QWEN36_27B)
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", "--drafter-kind", "dflash2")))
    d = facts.drafter_config
    assert facts.layer_ids == PUBLISHED_IDS and d.target_layer_ids == PUBLISHED_IDS
    assert d.layer_types == ["sliding_attention"] * 5 and d.sliding_window == 2048 and d.sliding_window_non_causal
    assert (d.block_size, d.mask_token_id, d.num_attention_heads, d.num_key_value_heads, d.head_dim,
            d.intermediate_size, d.rope_theta) == (8, 248070, 32, 8, 128, 17408, 1e7)
    assert (d.conv_kernel_size, d.conv_group_size, d.selector_rank, d.selector_top_k) == (2, 16, 256, 16)
    assert "drafter: 5 layers (5 sliding_attention, window 2048, non-causal in the block), hidden 5120, 32/8 heads " \
           "of 128, MLP 17408, block 8, rope theta 1e+07; dflash2: 2 conv taps, conv group 16, selector rank 256, " \
           "top-16" in "\n".join(facts.summary)


def test_flags_still_win_over_the_dflash2_defaults(tmp_path, data_dir, no_weights_read):  # noqa: F811
    model = fake_wrapped_checkpoint(tmp_path / "m", QWEN36_27B)
    argv = _argv(model, data_dir, tmp_path / "run", "--drafter-kind", "dflash2", "--block-size", "16",
                 "--target-layers", "1,16,31,46,61", "--drafter-layer-types", "sliding*4,full", "--sliding-window",
                 "512")
    facts = pf.preflight(parse_args(argv))
    d = facts.drafter_config
    assert d.block_size == 16 and d.target_layer_ids == [1, 16, 31, 46, 61]
    assert d.layer_types == ["sliding_attention"] * 4 + ["full_attention"] and d.sliding_window == 512
    assert d.sliding_window_non_causal  # DFlash 2's sliding layers, whichever layers the flags ask for


def test_dflash_runs_keep_their_defaults(tmp_path, data_dir, no_weights_read):  # noqa: F811
    model = fake_wrapped_checkpoint(tmp_path / "m", QWEN36_27B)
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))
    d = facts.drafter_config
    assert facts.layer_ids == [1, 16, 31, 46, 61] and d.block_size == 16
    assert d.layer_types == ["sliding_attention"] * 4 + ["full_attention"] and not d.sliding_window_non_causal


# z-lab/Qwen3.8-27B-DFlash2's config.json (revision 50307d4c4cde6860d4eee73e2547cd786fe8e8a4), the
# keys dflash-export reads
PUBLISHED = {
    "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
    "dflash_config": {"block_size": 8, "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                      "selector_top_k": 16, "mask_token_id": 248070, "target_layer_ids": PUBLISHED_IDS},
    "num_target_layers": 64, "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 5, "rms_norm_eps": 1e-6, "vocab_size": 248320,
    "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048, "use_sliding_window": True,
    "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"}, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False}


def test_the_published_drafter_is_the_one_check_derives(tmp_path, data_dir, no_weights_read):  # noqa: F811
    from flashfleet_trainer.export import config_from_dflash

    published = config_from_dflash(PUBLISHED).to_dict()
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.8-27B", QWEN36_27B)
    derived = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", "--drafter-kind",
                                            "dflash2"))).drafter_config.to_dict()
    assert published["sliding_window_non_causal"] is True
    assert {k: v for k, v in derived.items() if k != "target_model"} == \
        {k: v for k, v in published.items() if k != "target_model"}


def test_export_reads_causality_as_the_loaders_do():
    from flashfleet_trainer.errors import ConfigError
    from flashfleet_trainer.export import config_from_dflash

    legacy = {k: v for k, v in PUBLISHED.items() if k != "is_causal"}  # absent: sliding layers causal
    assert config_from_dflash(legacy).sliding_window_non_causal is False
    fallback = {**legacy, "dflash_config": {**legacy["dflash_config"], "causal": False}}  # vLLM's second place
    assert config_from_dflash(fallback).sliding_window_non_causal is True
    mixed = {**PUBLISHED, "is_causal": True, "layer_types": ["sliding_attention"] * 4 + ["full_attention"]}
    with pytest.raises(ConfigError, match="is_causal true makes its full_attention layers causal"):
        config_from_dflash(mixed)
