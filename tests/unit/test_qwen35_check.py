"""`dflash-train --check` on the supported targets (qwen3, qwen3_5, qwen3_5_moe, composite configs
read through text_config), on the real Qwen3.6-27B / Qwen3.5-35B-A3B shapes (config.json as
published plus header-only fake weights: --check reads headers, never data), the linear-attention
path it reports and refuses, the drafter it derives, and an unsupported architecture.
"""

import json
import struct
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer import preflight as pf
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.errors import ConfigError

# Qwen3.6-27B's config.json: the facts of the published checkpoint (model_type qwen3_5, the
# multimodal wrapper; text_config as in THUDM/slime's qwen3.5-27B recipe and public reproductions).
QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054, "tie_word_embeddings": False, "eos_token_id": 248046, "pad_token_id": 248044,
    "text_config": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
        "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
        "hidden_act": "silu", "attention_bias": False, "attn_output_gate": True, "full_attention_interval": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "mtp_num_hidden_layers": 1, "eos_token_id": 248044,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "dtype": "bfloat16"},
    "vision_config": {"model_type": "qwen3_5", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "num_position_embeddings": 2304, "out_hidden_size": 5120,
                      "hidden_act": "gelu_pytorch_tanh"},
}
# Qwen3.5-35B-A3B: transformers' Qwen3_5MoeTextConfig defaults ("Qwen3.5-35B-A3B style"), RoPE base
# 1e7 as in THUDM/slime's qwen3.5-35B-A3B recipe.
QWEN35_35B_A3B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_experts": 256,
        "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True}, "dtype": "bfloat16"},
    "vision_config": {"model_type": "qwen3_5_moe", "out_hidden_size": 2048},
}
PUBLISHED_27B_DRAFTER = dict(num_hidden_layers=5, hidden_size=5120, intermediate_size=17408, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=128, sliding_window=2048, block_size=16,
                             mask_token_id=248070, target_layer_ids=[1, 16, 31, 46, 61], vocab_size=248320,
                             layer_types=["sliding_attention"] * 4 + ["full_attention"], rope_theta=1e7)


def write_safetensors_header_only(path, tensors: dict):
    """A valid safetensors file {name: (dtype, shape)} whose data is a hole (sparse, all zeros):
    its header is real, its size is the real size, and no data block is written."""
    nbytes = {"BF16": 2, "F32": 4}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = nbytes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)


def fake_wrapped_checkpoint(d, config: dict):
    """config.json as published, the language model's embedding and head in shard 1 (header-only,
    full size), and the vision tower named by the index in shard 2, which is garbage: --check must
    neither read data nor open that shard."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    t = config["text_config"]
    v, h = t["vocab_size"], t["hidden_size"]
    lang = {"model.language_model.embed_tokens.weight": ("BF16", [v, h]), "lm_head.weight": ("BF16", [v, h]),
            "model.language_model.norm.weight": ("BF16", [h])}
    write_safetensors_header_only(d / "model-00001-of-00002.safetensors", lang)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"not a safetensors file")
    wm = dict.fromkeys(lang, "model-00001-of-00002.safetensors")
    wm.update(dict.fromkeys(["model.visual.patch_embed.proj.weight", "model.visual.blocks.0.attn.qkv.weight"],
                            "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.table({"input_ids": [[1, 2, 3, 4, 5, 6]] * 4}), d / "train.parquet")
    return d


@pytest.fixture
def no_weights_read(monkeypatch):
    """--check must never read a tensor's data nor build a model: every way to do so raises."""
    import safetensors
    import safetensors.torch
    import transformers
    import transformers.modeling_utils  # imported first, so it binds the real safe_open for later tests

    def boom(*a, **kw):
        raise AssertionError("--check read weights")

    monkeypatch.setattr(safetensors, "safe_open", boom)
    monkeypatch.setattr(transformers.modeling_utils, "safe_open", boom)
    monkeypatch.setattr(safetensors.torch, "load_file", boom)
    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(boom))
    monkeypatch.setattr(pf, "_mem_available_bytes", lambda: 1 << 50)  # the host's RAM is not under test


def _argv(model, data, out, *extra):
    return ["--target-model", str(model), "--data-dir", str(data), "--output-dir", str(out),
            "--target-gpus", "cpu", "--drafter-gpus", "cpu", *extra]


def test_check_on_the_real_qwen36_27b_shape_derives_the_published_drafter(tmp_path, data_dir, no_weights_read):
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.6-27B", QWEN36_27B)
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))
    d = facts.drafter_config
    for k, v in PUBLISHED_27B_DRAFTER.items():
        assert getattr(d, k) == v, k
    assert facts.layer_ids == [1, 16, 31, 46, 61] and facts.vocab_size == 248320 and facts.mask_token_id == 248070
    text = "\n".join(facts.summary)
    assert "qwen3_5, text qwen3_5_text, 64 layers: 48 linear_attention, 16 full_attention, hidden 5120" in text
    assert "2 other tensor(s) (vision tower, MTP) never read" in text
    assert "linear attention (48 Gated-DeltaNet layers) on CPU" in text
    assert "drafter: 5 layers (4 sliding_attention, 1 full_attention, window 2048), hidden 5120, 32/8 heads of 128, " \
           "MLP 17408, block 16, rope theta 1e+07" in text


def test_check_on_the_qwen35_35b_a3b_shape(tmp_path, data_dir, no_weights_read):
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.5-35B-A3B", QWEN35_35B_A3B)
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))
    d = facts.drafter_config
    assert facts.layer_ids == [1, 10, 19, 28, 37] and d.mask_token_id == 248070 and d.hidden_size == 2048
    assert (d.num_attention_heads, d.num_key_value_heads, d.head_dim, d.intermediate_size) == (32, 8, 128, 6144)
    assert "qwen3_5_moe, text qwen3_5_moe_text, 40 layers: 30 linear_attention, 10 full_attention" in \
        "\n".join(facts.summary)


def test_flags_override_the_drafter_shape(tmp_path, data_dir, no_weights_read):
    model = fake_wrapped_checkpoint(tmp_path / "m", QWEN36_27B)
    argv = _argv(model, data_dir, tmp_path / "run", "--num-draft-layers", "3", "--drafter-layer-types",
                 "full,sliding,full", "--sliding-window", "512", "--drafter-num-heads", "16",
                 "--drafter-num-kv-heads", "4", "--drafter-head-dim", "64", "--drafter-intermediate-size", "8192")
    d = pf.preflight(parse_args(argv)).drafter_config
    assert d.layer_types == ["full_attention", "sliding_attention", "full_attention"] and d.sliding_window == 512
    assert (d.num_attention_heads, d.num_key_value_heads, d.head_dim, d.intermediate_size) == (16, 4, 64, 8192)
    d = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", "--drafter-layer-types",
                                      "full*5"))).drafter_config
    assert d.layer_types == ["full_attention"] * 5 and d.sliding_window is None
    for bad, match in ((["--drafter-layer-types", "sliding,full"], "2 layer type"),
                       (["--drafter-layer-types", "linear*5"], "not one of"),
                       (["--drafter-layer-types", "full*5", "--sliding-window", "64"], "no draft layer is sliding"),
                       (["--sliding-window", "0"], "must be >= 1"),
                       (["--drafter-num-heads", "30"], "not a multiple"),
                       (["--mask-token-id", "248320"], "not a row")):
        with pytest.raises(ConfigError, match=match):
            pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", *bad)))


def test_a_qwen3_target_needs_a_window_for_sliding_layers(trainer_argv):
    with pytest.raises(ConfigError, match="sliding_window"):
        pf.preflight(parse_args(trainer_argv("--drafter-layer-types", "sliding")))
    facts = pf.preflight(parse_args(trainer_argv("--drafter-layer-types", "sliding", "--sliding-window", "8")))
    assert facts.drafter_config.layer_types == ["sliding_attention"] and facts.drafter_config.sliding_window == 8


def _fake_gpus(monkeypatch, n=8):
    props = SimpleNamespace(total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (140 * 2**30, 141 * 2**30))


def test_a_gpu_run_on_the_slow_linear_attention_path_is_refused(tmp_path, data_dir, no_weights_read, monkeypatch):
    _fake_gpus(monkeypatch)
    model = fake_wrapped_checkpoint(tmp_path / "m", QWEN36_27B)
    argv = ["--target-model", str(model), "--data-dir", str(data_dir), "--output-dir", str(tmp_path / "run"),
            "--target-gpus", "0,1,2,3,4,5,6", "--drafter-gpus", "7"]
    monkeypatch.setattr(pf, "linear_attention_kernels",
                        lambda cfg=None: {"chunk_gated_delta_rule": "torch", "causal_conv1d_fn": "torch"})
    with pytest.raises(ConfigError, match="torch fallback on GPU") as e:
        pf.preflight(parse_args(argv))
    assert "--allow-slow-linear-attention" in e.value.fix and "flash-linear-attention" in e.value.fix
    facts = pf.preflight(parse_args([*argv, "--allow-slow-linear-attention"]))
    assert any("torch reference (slow)" in s and "allowed by --allow-slow-linear-attention" in s for s in facts.summary)
    monkeypatch.setattr(pf, "linear_attention_kernels", lambda cfg=None: {
        "chunk_gated_delta_rule": "fla.ops.gated_delta_rule.chunk", "causal_conv1d_fn": "torch"})
    facts = pf.preflight(parse_args(argv))
    line = next(s for s in facts.summary if s.startswith("linear attention"))
    assert "on GPU: delta rule flash-linear-attention (fla.ops.gated_delta_rule.chunk), short conv torch conv1d" in line
    from flashfleet_trainer import short_conv  # where fla's convolution kernel imports, it is bound at load

    monkeypatch.setattr(short_conv, "fla_kernel", lambda: object())
    line = next(s for s in pf.preflight(parse_args(argv)).summary if s.startswith("linear attention"))
    assert "short conv fla (fla.modules.causal_conv1d)" in line
    # and a CPU target cannot use fla's GPU-only kernels
    with pytest.raises(ConfigError, match="GPU only"):
        pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))


def test_this_hosts_linear_attention_kernels_are_named():
    """What transformers actually bound here (the CPU venv has neither package): the torch path."""
    from flashfleet_trainer.target import linear_attention_kernels

    k = linear_attention_kernels()
    assert set(k) == {"chunk_gated_delta_rule", "causal_conv1d_fn"}
    try:
        import fla  # noqa: F401
    except Exception:
        assert k["chunk_gated_delta_rule"] == "torch"
    else:  # pragma: no cover - a venv with flash-linear-attention
        assert k["chunk_gated_delta_rule"].startswith("fla.")


def test_the_mask_token_must_be_a_spare_row_of_the_tokenizer(tmp_path, data_dir, no_weights_read):
    model = fake_wrapped_checkpoint(tmp_path / "m", QWEN36_27B)
    tok = {"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(248044)}},
           "added_tokens": [{"id": 248044 + i, "content": f"<|special{i}|>"} for i in range(26)]}
    (model / "tokenizer.json").write_text(json.dumps(tok))
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))
    assert any("mask id 248070: a spare row (not a token of the tokenizer's 248070)" in s for s in facts.summary)
    facts = pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", "--mask-token-id", "248050")))
    assert any("the tokenizer's added token '<|special6|>'" in s for s in facts.summary)
    with pytest.raises(ConfigError, match="ordinary token 't1000'"):
        pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run", "--mask-token-id", "1000")))


def test_a_broken_language_shard_fails_the_check(tmp_path, data_dir):
    model = fake_wrapped_checkpoint(tmp_path / "m", QWEN36_27B)
    shard = model / "model-00001-of-00002.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 2)
    with pytest.raises(ConfigError, match="shard model-00001-of-00002.safetensors: .*outside the .*-byte data"):
        pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))


def test_an_embedding_that_does_not_match_the_config_fails_the_check(tmp_path, data_dir):
    cfg = json.loads(json.dumps(QWEN36_27B))
    cfg["text_config"]["hidden_size"] = 4096  # config of one model, weights of another
    model = tmp_path / "m"
    fake_wrapped_checkpoint(model, QWEN36_27B)
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"embed_tokens.weight is \[248320, 5120\], not \[248320, 4096\]"):
        pf.preflight(parse_args(_argv(model, data_dir, tmp_path / "run")))


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory):
    from flashfleet_trainer.tiny import make_hybrid_target, save_wrapped

    model, cfg = make_hybrid_target(64, 32, 4, seed=0)
    out = tmp_path_factory.mktemp("tiny_hybrid")
    save_wrapped(model, cfg, out / "wrapped", seed=0, shard_kb=60)
    model.save_pretrained(out / "text_only")  # Qwen3_5ForCausalLM: model_type qwen3_5_text, keys model.*
    return out


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5", "qwen3_5_text", "qwen3_5_moe"])
def test_check_passes_on_each_supported_architecture(arch, trainer_tiny, tiny_hybrid, tmp_path, data_dir, capsys,
                                                     monkeypatch):
    if arch == "qwen3":
        model = trainer_tiny / "model"
    elif arch == "qwen3_5":
        model = tiny_hybrid / "wrapped"
    elif arch == "qwen3_5_text":
        model = tiny_hybrid / "text_only"
    else:
        model = fake_wrapped_checkpoint(tmp_path / "moe", QWEN35_35B_A3B)
    extra = [] if arch == "qwen3" else ["--drafter-num-heads", "4", "--drafter-num-kv-heads", "2",
                                        "--drafter-head-dim", "8", "--drafter-intermediate-size", "64"]
    monkeypatch.setattr(pf, "_mem_available_bytes", lambda: 1 << 50)  # the fake 35B's 1 GB head
    rc = main([*_argv(model, data_dir, tmp_path / "run", "--num-draft-layers", "2", *extra), "--check"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "check: ok" in out.out
    kind = {"qwen3": "(qwen3,", "qwen3_5": "(qwen3_5, text qwen3_5_text,", "qwen3_5_text": "(qwen3_5_text,",
            "qwen3_5_moe": "(qwen3_5_moe, text qwen3_5_moe_text,"}[arch]
    assert kind in out.out


@pytest.mark.parametrize("config", [
    {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 100},
    {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
     "intermediate_size": 128, "vocab_size": 100},
    {"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                            "num_attention_heads": 2, "vocab_size": 100},
     "vision_config": {"model_type": "clip_vision_model"}},  # a composite whose text model is not supported
], ids=["gpt2", "bert", "llava-llama"])
def test_an_unsupported_architecture_fails_the_check_naming_the_supported_ones(config, tmp_path, data_dir, capsys):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    write_safetensors_header_only(model / "model.safetensors", {"w": ("F32", [2])})
    rc = main([*_argv(model, data_dir, tmp_path / "run"), "--check"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_CONFIG and len(err) == 1, err
    assert "is not supported (supported: qwen3, qwen3_5, qwen3_5_moe, and any composite config whose " \
           "text_config is qwen3, qwen3_5_text, qwen3_5_moe_text)" in err[0]


def test_the_second_incidents_4_plus_4_run_asks_vllm_for_the_published_drafters_layers(
        tmp_path, data_dir, no_weights_read, capsys):
    """inventory/example's v2-ada (8 x 48 GB: two vLLM servers of TP 2 on GPUs 0-3, four drafter ranks
    on 4-7) on the real Qwen3.6-27B config: the servers' GPUs and the drafters' are the card's eight,
    and the trainer tells the servers to extract the published drafter's layers plus the last one."""
    from flashfleet_trainer.vllm_target import serve_argv

    from tests.unit.test_inventories import _inventory, _runs

    run = _runs(_inventory("example"))["v2-ada"]
    servers, tp = run["vllm"]["servers"], run["vllm"]["args"]["tensor-parallel-size"]
    server_gpus = [g for s in servers for g in s["gpus"].split(",")]
    drafter_gpus = run["trainer"]["drafter_gpus"].split(",")
    assert all(len(s["gpus"].split(",")) == tp for s in servers)
    assert sorted(server_gpus + drafter_gpus, key=int) == [str(i) for i in range(8)]
    assert run["vllm"]["args"]["max-model-len"] >= run["trainer"]["max_seq_len"] + 1
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.6-27B", QWEN36_27B)
    config = dict(run["trainer"], target_model=str(model), data_dir=str(data_dir), output_dir=str(tmp_path / "run"),
                  drafter_gpus="cpu",  # this machine has no GPU: the layers do not depend on it
                  target_servers=",".join(f"http://127.0.0.1:{s['port']}" for s in servers))  # as train_unit sets it
    (tmp_path / "v2-ada.json").write_text(json.dumps(config))
    assert main(["--config", str(tmp_path / "v2-ada.json"), "--serve-config"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["layers"] == [2, 17, 32, 47, 62, 64]
    assert printed["argv"] == serve_argv([1, 16, 31, 46, 61], 64)
