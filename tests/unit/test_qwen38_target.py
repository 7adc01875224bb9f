"""Qwen3.8 targets (docs/trainer.md, "Targets: Qwen3.8"): what the trainer takes and what it refuses.

- Qwen3.8-27B is the Qwen3.6-27B architecture (`qwen3_5`, `Qwen3_5ForConditionalGeneration`, text
  `qwen3_5_text`, the same config.json keys and values): a tiny random model of it, saved as the
  real one is (with its MTP head under mtp.*), loads through its language model only.
- Qwen3.8-27B-FP8 (Qwen's own quantized release: config.json's quantization_config, float8 weights
  with per-block weight_scale_inv) is refused before a shard is opened: loaded as bf16 its weights
  would lose their scales (a wrong target, silently).
- Qwen3.8-2.4T-A95B is a flat text checkpoint (`qwen3_5_moe_text`, `Qwen3_5MoeForCausalLM`, weights
  under model.layers.*): a tiny random one loads and gives transformers' own features.
- Qwen3.8-Flash-Next is `qwen4_exp` (hyper-connection residual streams, n-gram embeddings): refused.
"""

import json

import pytest
import torch
from flashfleet_trainer import preflight as pf
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.target import (
    HiddenStateProducer,
    check_target_config,
    load_final_norm,
    load_frozen_io,
    load_target_model,
    quantization_of,
)
from safetensors.torch import load_file, save_file

from tests.unit.test_qwen35_check import QWEN36_27B, _argv, data_dir, fake_wrapped_checkpoint  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB, HIDDEN, LAYERS = 64, 32, 8
# Qwen/Qwen3.8-27B-FP8's quantization_config (block-wise float8 e4m3, dynamic activations)
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.fixture(scope="module")
def qwen38(tmp_path_factory, one_torch_thread):
    """A tiny Qwen3.8-27B: the hybrid wrapper with the 27B's MTP metadata, saved sharded."""
    from flashfleet_trainer.tiny import make_hybrid_target, save_wrapped

    model, cfg = make_hybrid_target(VOCAB, HIDDEN, LAYERS, seed=3)
    cfg.text_config.mtp_num_hidden_layers = 1
    out = tmp_path_factory.mktemp("qwen38")
    save_wrapped(model, cfg, out, seed=3, shard_kb=60)
    return out


def _copy(src, dst, convert=lambda name, t: {name: t}, extra_shard=None, config=None):
    """src's checkpoint rewritten tensor by tensor (convert), plus extra_shard {name: bytes of a shard}."""
    dst.mkdir()
    index = json.loads((src / "model.safetensors.index.json").read_text())
    wm = {}
    for f in sorted(set(index["weight_map"].values())):
        out = {}
        for name, t in load_file(str(src / f)).items():
            out.update(convert(name, t))
        save_file(out, str(dst / f), metadata={"format": "pt"})
        wm.update(dict.fromkeys(out, f))
    for f, (names, raw) in (extra_shard or {}).items():
        wm.update(dict.fromkeys(names, f))
        (dst / f).write_bytes(raw)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    return dst


def _fp8(name, t):
    """A language layer's projection as the FP8 release stores it: float8 values and the inverse scale."""
    if not (name.startswith("model.language_model.layers.") and name.endswith("proj.weight") and t.dim() == 2):
        return {name: t}
    scale = t.abs().max().clamp(min=1e-12) / 448.0
    return {name: (t / scale).to(torch.float8_e4m3fn), name[:-len("weight")] + "weight_scale_inv": scale.reshape(1, 1)}


def _spy_opens(monkeypatch):
    import safetensors

    opened, real = [], safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, *a, **kw: opened.append(str(path)) or real(path, *a, **kw))
    return opened


def test_the_qwen38_27b_language_model_loads_without_its_mtp_head_or_vision_tower(qwen38, tmp_path, monkeypatch):
    """The MTP head (mtp.*) lives in a shard of its own, garbage here: never opened; the features and
    the teacher's logits are transformers' own for the multimodal model."""
    from transformers import AutoModelForImageTextToText

    mtp = ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"]
    ck = _copy(qwen38, tmp_path / "ck", extra_shard={"model-mtp.safetensors": (mtp, b"\x00garbage" * 100)})
    assert json.loads((ck / "config.json").read_text())["text_config"]["mtp_num_hidden_layers"] == 1
    opened = _spy_opens(monkeypatch)
    producer = HiddenStateProducer(ck, ["cpu"], [1, 3, 6], "cpu")
    monkeypatch.undo()
    assert opened and not any("mtp" in p for p in opened)
    ref = AutoModelForImageTextToText.from_pretrained(qwen38, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(1, VOCAB - 1, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ref(input_ids=ids, output_hidden_states=True)
    feats, last = producer.forward(ids)
    hs = out.hidden_states
    torch.testing.assert_close(feats, torch.cat([hs[2], hs[4], hs[7]], -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last @ producer.lm_head_weight.T, out.logits, atol=1e-4, rtol=1e-4)


def test_the_fp8_release_is_refused_before_a_shard_is_opened(qwen38, tmp_path, monkeypatch):
    """Without the refusal the wrapped path loads the float8 values as bf16/fp32 weights and drops
    their scales: a different model, with no error."""
    ck = _copy(qwen38, tmp_path / "fp8", convert=_fp8, config={"quantization_config": FP8})
    from transformers import AutoConfig

    assert quantization_of(AutoConfig.from_pretrained(qwen38)) is None
    assert quantization_of(AutoConfig.from_pretrained(ck)) == "fp8"
    opened = _spy_opens(monkeypatch)
    with pytest.raises(ConfigError, match=r"quantized checkpoint \(fp8\)") as e:
        load_target_model(ck, "cpu", torch.float32)
    assert not opened
    assert "Qwen/Qwen3.8-27B, not Qwen/Qwen3.8-27B-FP8" in e.value.fix and "--target-servers" in e.value.fix
    monkeypatch.undo()
    # what a run whose target is served by vLLM reads from it, unquantized in the release, still loads
    embed, head = load_frozen_io(ck, "cpu", torch.float32)
    ref_embed, ref_head = load_frozen_io(qwen38, "cpu", torch.float32)
    torch.testing.assert_close(embed, ref_embed)
    torch.testing.assert_close(head, ref_head)
    torch.testing.assert_close(load_final_norm(ck, "cpu", torch.float32).weight,
                               load_final_norm(qwen38, "cpu", torch.float32).weight)


def test_check_refuses_the_fp8_27b_where_the_run_would_load_it(tmp_path, data_dir, monkeypatch):  # noqa: F811
    """--check on Qwen3.8-27B-FP8's config (the 27B's, plus its quantization_config): refused for a target
    loaded here; with --target-servers only where an evaluation or the server check would load it."""
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.8-27B-FP8", {**QWEN36_27B, "quantization_config": FP8})
    monkeypatch.setattr(pf, "_mem_available_bytes", lambda: 1 << 50)
    with pytest.raises(ConfigError, match=r"quantized checkpoint \(fp8\), which this run would load"):
        pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))
    monkeypatch.setattr(pf, "check_target_servers", lambda *a: ["http://127.0.0.1:9"])
    served = ["--target-servers", "http://127.0.0.1:9"]
    (data_dir / "eval").mkdir()
    (data_dir / "eval" / "prompts.jsonl").write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    for loads_it in (["--eval-interval", "0"], ["--eval-num-prompts", "0"],  # the final, the interval evaluations
                     ["--eval-num-prompts", "0", "--eval-interval", "0", "--server-check-every", "8"]):
        with pytest.raises(ConfigError, match="quantized"):
            pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", *served, *loads_it)))
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", *served, "--eval-num-prompts", "0",
                                          "--eval-interval", "0")))
    assert facts.layer_ids == [1, 16, 31, 46, 61] and facts.mask_token_id == 248070
    # the bf16 Qwen3.8-27B (the Qwen3.6-27B's config.json) is taken as before
    bf16 = fake_wrapped_checkpoint(tmp_path / "Qwen3.8-27B", QWEN36_27B)
    assert pf.preflight(parse_args(_argv(bf16, data_dir, tmp_path / "run2"))).drafter_config.sliding_window == 2048


def test_the_flat_moe_layout_of_the_2_4t_loads(tmp_path):
    """Qwen3.8-2.4T-A95B's layout: a Qwen3_5MoeForCausalLM with its config at the top level
    (model_type qwen3_5_moe_text) and its language model under model.layers.*."""
    from flashfleet_trainer.tiny import make_hybrid_target
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    _, cfg = make_hybrid_target(VOCAB, HIDDEN, LAYERS, seed=4)
    text = {k: v for k, v in cfg.text_config.to_dict().items()
            if k not in ("intermediate_size", "model_type", "transformers_version", "architectures")}
    text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
    torch.manual_seed(4)
    ref = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**text)).eval()
    ref.save_pretrained(tmp_path / "m", max_shard_size="100KB")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("qwen3_5_moe_text", ["Qwen3_5MoeForCausalLM"])
    producer = HiddenStateProducer(tmp_path / "m", ["cpu"], [1, 4], "cpu")
    ids = torch.randint(1, VOCAB - 1, (1, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = ref(input_ids=ids, output_hidden_states=True)
    feats, last = producer.forward(ids)
    torch.testing.assert_close(feats, torch.cat([out.hidden_states[2], out.hidden_states[5]], -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last @ producer.lm_head_weight.T, out.logits, atol=1e-4, rtol=1e-4)


def test_flash_next_qwen4_exp_is_not_a_supported_target():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("qwen4_exp")
    with pytest.raises(ValueError, match="'qwen4_exp' \\(text_config 'qwen4_exp_text'\\) is not supported"):
        check_target_config(cfg)
