"""Qwen3.5/3.6 hybrid targets: the wrapped checkpoint layout, loading without the vision tower,
the feature convention on a hybrid stack, the teacher's logits, the frozen embedding and head.

The checkpoints are tiny random Qwen3_5(Moe)ForConditionalGeneration models saved the way the
real ones are (config with text_config, model.language_model.*, model.visual.*, lm_head.weight,
sharded with an index); transformers' own multimodal class, loaded the ordinary way, is the
reference every figure is compared with.
"""

import json

import pytest
import torch
from flashfleet_trainer.target import (
    HiddenStateProducer,
    checkpoint_tensors,
    load_frozen_io,
    load_target_model,
    text_tensor_files,
)
from safetensors.torch import load_file, save_file

VOCAB, HIDDEN, LAYERS = 64, 32, 8  # 8 layers: linear x3, full, linear x3, full


def _wrapped(tmp_path_factory, name, moe=False):
    from flashfleet_trainer.tiny import make_hybrid_target, save_wrapped

    model, cfg = make_hybrid_target(VOCAB, HIDDEN, LAYERS, seed=1)
    if moe:
        from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        text = cfg.text_config.to_dict()
        for k in ("intermediate_size", "model_type", "transformers_version", "architectures"):
            text.pop(k, None)
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
        cfg = Qwen3_5MoeConfig(text_config=text, vision_config=cfg.vision_config.to_dict(), tie_word_embeddings=False)
        torch.manual_seed(2)
        wrapped = Qwen3_5MoeForConditionalGeneration(cfg)
        out = tmp_path_factory.mktemp(name)
        wrapped.save_pretrained(out, max_shard_size="100KB")
        return out
    out = tmp_path_factory.mktemp(name)
    save_wrapped(model, cfg, out, seed=1, shard_kb=60)
    return out


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return _wrapped(tmp_path_factory, "hybrid")


@pytest.fixture(scope="module")
def hybrid_moe(tmp_path_factory):
    return _wrapped(tmp_path_factory, "hybrid_moe", moe=True)


def _reference(path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def test_the_tiny_checkpoint_is_keyed_like_the_real_one(hybrid):
    cfg = json.loads((hybrid / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5" and cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    text = cfg["text_config"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + \
        ["full_attention"]
    assert text["tie_word_embeddings"] is False and text["rope_parameters"]["partial_rotary_factor"] == 0.25
    names = checkpoint_tensors(hybrid)
    assert (hybrid / "model.safetensors.index.json").is_file() and len(set(names.values())) > 2
    assert "lm_head.weight" in names and "model.language_model.embed_tokens.weight" in names
    assert any(n.startswith("model.visual.") for n in names)
    assert any(".linear_attn.in_proj_qkv." in n for n in names) and any(".self_attn.q_proj." in n for n in names)
    assert not any(n.startswith(("model.layers.", "model.embed_tokens")) for n in names)


def test_features_follow_the_convention_on_a_hybrid_stack(hybrid):
    """target_layer_ids[i] = output of decoder layer i = HF hidden_states[i+1]: the producer's hooks
    agree with transformers' output_hidden_states of the multimodal model, at every linear-attention
    and full-attention layer but the last, whose HF entry is the final-normed state."""
    ref = _reference(hybrid)
    ids = torch.randint(1, VOCAB - 1, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ref(input_ids=ids, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == LAYERS + 1
    ids_all = list(range(LAYERS))
    producer = HiddenStateProducer(hybrid, ["cpu"], ids_all, "cpu")
    feats, last = producer.forward(ids)
    per_layer = feats.split(HIDDEN, dim=-1)
    kinds = producer.replicas[0][1].config.layer_types
    assert {kinds[i] for i in range(LAYERS - 1)} == {"linear_attention", "full_attention"}
    for i in range(LAYERS - 1):
        torch.testing.assert_close(per_layer[i], hs[i + 1], atol=1e-5, rtol=1e-5, msg=f"layer {i} ({kinds[i]})")
    # the last layer: hooks see its raw output, HF's hidden_states[L] is it after the final norm
    norm = producer.replicas[0][1].get_decoder().norm
    torch.testing.assert_close(norm(per_layer[-1]), hs[LAYERS], atol=1e-5, rtol=1e-5)
    # the teacher: the final-normed state through the untied LM head gives the target's logits
    torch.testing.assert_close(last, hs[LAYERS], atol=1e-5, rtol=1e-5)
    logits = last @ producer.lm_head_weight.T
    torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=1e-4)
    assert not torch.equal(producer.lm_head_weight, producer.embed_weight)
    # features come out in target_layer_ids order, duplicates allowed
    p2 = HiddenStateProducer(hybrid, ["cpu"], [5, 1, 5], "cpu")
    f2, _ = p2.forward(ids)
    torch.testing.assert_close(f2, torch.cat([hs[6], hs[2], hs[6]], dim=-1), atol=1e-5, rtol=1e-5)


def test_right_padding_does_not_change_a_hybrid_targets_features(hybrid):
    """Micro-batches are right-padded: the linear-attention layers' recurrence must not let padding
    leak into the valid positions of a shorter sequence."""
    producer = HiddenStateProducer(hybrid, ["cpu"], [1, 3, 5], "cpu")
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(1, VOCAB - 1, (1, 30), generator=g), torch.randint(1, VOCAB - 1, (1, 17), generator=g)
    ids = torch.zeros(2, 30, dtype=torch.long)
    ids[0], ids[1, :17] = a[0], b[0]
    mask = torch.zeros(2, 30, dtype=torch.long)
    mask[0], mask[1, :17] = 1, 1
    feats, last = producer.forward(ids, mask)
    fb, lb = producer.forward(b)
    torch.testing.assert_close(feats[1, :17], fb[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last[1, :17], lb[0], atol=1e-5, rtol=1e-5)


def _without_vision(src, dst, vision_file_bytes=None):
    """A copy of the checkpoint whose vision tensors all live in one shard of their own, which is
    absent (vision_file_bytes None) or garbage bytes; the index still names it."""
    dst.mkdir()
    index = json.loads((src / "model.safetensors.index.json").read_text())
    for f in sorted(set(index["weight_map"].values())):
        tensors = load_file(str(src / f))
        keep = {n: t for n, t in tensors.items() if not n.startswith("model.visual.")}
        if keep:
            save_file(keep, str(dst / f), metadata={"format": "pt"})
    for name in index["weight_map"]:
        if name.startswith("model.visual."):
            index["weight_map"][name] = "model-vision.safetensors"
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    for f in ("config.json", "generation_config.json"):
        if (src / f).exists():
            (dst / f).write_text((src / f).read_text())
    if vision_file_bytes is not None:
        (dst / "model-vision.safetensors").write_bytes(vision_file_bytes)
    return dst


@pytest.mark.parametrize("vision", ["absent", "garbage"])
def test_the_language_model_loads_without_ever_opening_the_vision_tower(hybrid, tmp_path, vision, monkeypatch):
    import safetensors

    ck = _without_vision(hybrid, tmp_path / "ck", None if vision == "absent" else b"\x00garbage" * 1000)
    opened = []
    real = safetensors.safe_open

    def spy(path, *a, **kw):
        opened.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    model = load_target_model(ck, "cpu", torch.float32)
    monkeypatch.undo()
    assert opened and not any("vision" in p for p in opened)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"  # the text model only: no vision tower allocated
    assert not any("visual" in n for n, _ in model.named_parameters())
    ref = _reference(hybrid)
    ids = torch.randint(1, VOCAB - 1, (1, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    # the drafter ranks' frozen embedding and head, from the wrapped layout, the vision shard unread
    embed, head = load_frozen_io(ck, "cpu", torch.float32)
    torch.testing.assert_close(embed, ref.get_input_embeddings().weight)
    torch.testing.assert_close(head, ref.get_output_embeddings().weight)
    assert not torch.equal(embed, head)


def test_a_missing_language_tensor_is_an_error_not_a_random_init(hybrid, tmp_path):
    ck = _without_vision(hybrid, tmp_path / "ck")
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    victim = "model.language_model.layers.2.linear_attn.in_proj_qkv.weight"
    shard = index["weight_map"].pop(victim)
    tensors = load_file(str(ck / shard))
    tensors.pop(victim)
    save_file(tensors, str(ck / shard), metadata={"format": "pt"})
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(RuntimeError, match="lacks 1 tensor"):
        load_target_model(ck, "cpu", torch.float32)


def test_the_moe_target_loads_its_language_model_only(hybrid_moe):
    names = checkpoint_tensors(hybrid_moe)
    assert any(".mlp.experts.0.gate_proj." in n for n in names)  # per-expert tensors, as published
    files = text_tensor_files(names)
    assert not any(n.startswith("model.visual.") for ns in files.values() for n in ns)
    model = load_target_model(hybrid_moe, "cpu", torch.float32)
    assert type(model).__name__ == "Qwen3_5MoeForCausalLM"
    ref = _reference(hybrid_moe)
    ids = torch.randint(1, VOCAB - 1, (1, 15), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = ref(input_ids=ids, output_hidden_states=True)
    producer = HiddenStateProducer(hybrid_moe, ["cpu"], [1, 4], "cpu")
    feats, last = producer.forward(ids)
    torch.testing.assert_close(feats, torch.cat([out.hidden_states[2], out.hidden_states[5]], -1), atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(last @ producer.lm_head_weight.T, out.logits, atol=1e-4, rtol=1e-4)


def test_without_soft_labels_the_forward_stops_at_the_deepest_feature_layer(hybrid):
    """want_last=False: the same features, no final state, and no layer above the deepest feature
    layer runs (the target's work a CE-only run does not need)."""
    producer = HiddenStateProducer(hybrid, ["cpu"], [1, 4, 2], "cpu")
    ids = torch.randint(1, VOCAB - 1, (2, 19), generator=torch.Generator().manual_seed(3))
    layers = producer.replicas[0][1].get_decoder().layers
    ran = []
    hooks = [layer.register_forward_hook(lambda _m, _i, _o, k=k: ran.append(k)) for k, layer in enumerate(layers)]
    try:
        full, last = producer.forward(ids)
        assert ran == list(range(LAYERS)) and last is not None
        ran.clear()
        feats, none = producer.forward(ids, want_last=False)
    finally:
        for h in hooks:
            h.remove()
    assert ran == list(range(5)), ran  # layers 0..4 (the deepest feature layer is 4), nothing above
    assert none is None
    torch.testing.assert_close(feats, full, atol=0, rtol=0)
    # the producer is usable again afterwards: a full forward still gives the final state
    again, last2 = producer.forward(ids)
    torch.testing.assert_close(last2, last, atol=0, rtol=0)


def test_length_groups_bound_the_padding_and_cover_every_sequence():
    from flashfleet_trainer.target import length_groups

    rng = torch.Generator().manual_seed(4)
    for _ in range(50):
        lengths = torch.randint(1, 9000, (int(torch.randint(1, 40, (1,), generator=rng)),), generator=rng).tolist()
        groups = length_groups(lengths, 0.1)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            real, padded = sum(lengths[i] for i in g), len(g) * max(lengths[i] for i in g)
            assert padded <= 1.1 * real + 1e-9, (g, [lengths[i] for i in g])
    assert length_groups([8192] * 8) == [list(range(8))]  # equal lengths: one forward, as before
    assert length_groups([100, 8000, 120, 7900]) == [[1, 3], [2, 0]]


def test_forward_batch_gives_each_sequence_its_own_unpadded_features(hybrid):
    """The target's micro-batch forward in length groups: at every valid position the features and
    final state equal the sequence's own unpadded forward, padding is zeros, and the target runs far
    fewer padded tokens than the padded batch would (counted at the first layer's input)."""
    producer = HiddenStateProducer(hybrid, ["cpu"], [1, 3, 6], "cpu")
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([40, 7, 38, 9, 40, 21])
    ids = torch.zeros(len(lengths), int(lengths.max()), dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        ids[i, :n] = torch.randint(1, VOCAB - 1, (n,), generator=g)
    seen = []
    hook = producer.replicas[0][1].get_decoder().layers[0].register_forward_hook(
        lambda _m, inp, _o: seen.append(inp[0].shape[0] * inp[0].shape[1]))
    try:
        feats, last = producer.forward_batch(ids, lengths)
    finally:
        hook.remove()
    assert sum(seen) <= 1.1 * int(lengths.sum()) < ids.numel(), (seen, ids.numel())
    for i, n in enumerate(lengths.tolist()):
        own_f, own_l = producer.forward(ids[i:i + 1, :n])
        torch.testing.assert_close(feats[i, :n], own_f[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(last[i, :n], own_l[0], atol=1e-5, rtol=1e-5)
        assert not feats[i, n:].any() and not last[i, n:].any()
    feats_ce, none = producer.forward_batch(ids, lengths, want_last=False)
    assert none is None
    torch.testing.assert_close(feats_ce, feats, atol=0, rtol=0)
