"""Random-weight targets at real shapes, and random-token data, for throughput measurements.

    python -m flashfleet_trainer.shapes OUT --shape qwen3-8b [--layers N] [--seqs 64 --seq-len 4096]

writes OUT/model (a model directory of the shape's architecture, bf16 safetensors, random init)
and OUT/data/tokens.parquet. Throughput does not depend on the weights' values, so benchmarks at
the real width need no download; quality figures use `dflash-tiny` instead.

Shapes (`SHAPES`, the published configs' widths; the keys tests/benchmarks/bench_drafter.py reads are the Qwen3
ones: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
head_dim, plus `model_type`, from which the drafter's defaults follow):
- qwen3-8b, qwen3-32b: Qwen3ForCausalLM.
- qwen3.6-27b (the Qwen3.5/3.6-27B text model): 64 layers, hidden 5120, MLP 17,408, Gated-DeltaNet
  linear attention x3 then gated full attention (24 query / 4 KV heads of 256, partial RoPE
  0.25, theta 1e7), linear heads 16 key / 48 value of 128, conv 4, untied head, vocab 248,320.
  Source: THUDM/slime scripts/models/qwen3.5-27B.sh and the published config.json (as reproduced
  in public code); transformers' Qwen3_5TextConfig names every key.
- qwen3.5-35b-a3b: 40 layers, hidden 2048, 16 query / 2 KV heads of 256, 256 experts of 512 (8
  routed per token) plus a shared expert of 512, linear heads 16 key / 32 value of 128, conv 4,
  theta 1e7, untied, vocab 248,320. Source: transformers 5.24's Qwen3_5MoeTextConfig defaults
  (documented there as "Qwen3.5-35B-A3B style"), which agree with THUDM/slime
  scripts/models/qwen3.5-35B-A3B.sh (RoPE base 1e7 is slime's; transformers' default is 1e4).
Both hybrid shapes are written as the real checkpoints are: `Qwen3_5(Moe)ForConditionalGeneration`
with the published vision tower (27 blocks of 1152, patch 16), language weights under
model.language_model.*, sharded with an index, so the trainer's real loading path is measured.
"""

import argparse
from pathlib import Path

HYBRID_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
                     spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                     hidden_act="gelu_pytorch_tanh")
HYBRID_ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
               "mrope_section": [11, 11, 10], "mrope_interleaved": True}

SHAPES = {  # the published configs' widths
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128),
    "qwen3.6-27b": dict(model_type="qwen3_5_text", hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                        num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                        linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                        linear_conv_kernel_dim=4),
    "qwen3.5-35b-a3b": dict(model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40,
                            num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                            linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                            linear_conv_kernel_dim=4, num_experts=256, num_experts_per_tok=8,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512),
}
VOCAB = {"qwen3-8b": 151936, "qwen3-32b": 151936, "qwen3.6-27b": 248320, "qwen3.5-35b-a3b": 248320}


def shape_config(shape="qwen3-8b", layers=None):
    """The transformers config of a shape: a Qwen3Config, or for a hybrid shape the multimodal
    Qwen3_5(Moe)Config (text_config + the published vision tower) the real checkpoints carry."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig, Qwen3Config

    kw = dict(SHAPES[shape])
    if layers:
        kw["num_hidden_layers"] = layers
    kind = kw.pop("model_type", "qwen3")
    if kind == "qwen3":
        return Qwen3Config(vocab_size=VOCAB[shape], max_position_embeddings=40960, rope_theta=1_000_000.0,
                           rms_norm_eps=1e-6, tie_word_embeddings=False, **kw)
    n = kw["num_hidden_layers"]
    text = dict(kw, vocab_size=VOCAB[shape], max_position_embeddings=262144, rms_norm_eps=1e-6,
                tie_word_embeddings=False, rope_parameters=dict(HYBRID_ROPE), pad_token_id=None, bos_token_id=None,
                eos_token_id=248044,
                layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)])
    vision = dict(HYBRID_VISION, out_hidden_size=kw["hidden_size"])
    cls = Qwen3_5MoeConfig if kind == "qwen3_5_moe_text" else Qwen3_5Config
    return cls(text_config=text, vision_config=vision, tie_word_embeddings=False, eos_token_id=248046,
               pad_token_id=248044)


def write(out, shape="qwen3-8b", layers=None, seqs=64, seq_len=4096, seed=0, device=None):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    out = Path(out)
    cfg = shape_config(shape, layers)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    with torch.device(device):
        if getattr(cfg, "text_config", None) is not None:
            model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
        else:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out / "model", max_shard_size="5GB")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 151_000, size=(seqs, seq_len)).tolist()  # below every shape's spare mask rows
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": ids}), out / "data" / "tokens.parquet")
    return sum(p.numel() for p in model.parameters())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's own)")
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=4096)
    a = p.parse_args(argv)
    n = write(a.out, a.shape, a.layers, a.seqs, a.seq_len)
    print(f"wrote {a.out}/model ({n / 1e9:.2f}B params) and {a.out}/data ({a.seqs} x {a.seq_len} tokens)")


if __name__ == "__main__":
    main()
