"""Random-weight targets at real shapes, and random-token data, for throughput measurements.

    python -m flashfleet_trainer.shapes OUT --shape qwen3-8b [--layers N] [--seqs 64 --seq-len 4096]

writes OUT/model (a Qwen3-architecture model directory, bf16 safetensors, random init) and
OUT/data/tokens.parquet. Throughput does not depend on the weights' values, so benchmarks at
the real width need no download; quality figures use `dflash-tiny` instead.
"""

import argparse
from pathlib import Path

SHAPES = {  # the published configs' widths
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128),
}


def write(out, shape="qwen3-8b", layers=None, seqs=64, seq_len=4096, seed=0, device=None):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    out = Path(out)
    kw = dict(SHAPES[shape])
    if layers:
        kw["num_hidden_layers"] = layers
    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, **kw)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out / "model")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 151_000, size=(seqs, seq_len)).tolist()
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
