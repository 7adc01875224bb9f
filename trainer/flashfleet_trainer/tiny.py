"""`dflash-tiny OUT [--arch qwen3|qwen3_5]`: a tiny target and a data set sampled from it, in about a minute.

`--arch qwen3` (default): a Qwen3ForCausalLM. `--arch qwen3_5`: the Qwen3.5/3.6 layout in
miniature: the text model interleaves Gated-DeltaNet linear-attention layers with gated full
attention (three linear, then one full), saved as the real checkpoints are, a
`Qwen3_5ForConditionalGeneration` (config with a nested text_config and a tiny vision tower,
language weights under model.language_model.*, vision under model.visual.*, untied
lm_head.weight) in several safetensors shards with an index. Its text model is trained (the
vision tower stays random: nothing reads it).

The target is a real transformers Qwen3ForCausalLM (random init), trained briefly on a synthetic
"phrase language": a fixed set of short token phrases, chained by a sparse Markov rule (each
phrase has one dominant successor). Inside a phrase the next token is determined; between
phrases it is mostly determined. So the target becomes predictable quickly, its greedy
continuations are long runs a drafter can learn to guess, and an untrained drafter scores
tau near 1: exactly the contrast the trainer's quality bar needs.

Writes
    OUT/model/                      config.json + model.safetensors (qwen3_5: model-0000k-of-0000n
                                    shards + model.safetensors.index.json); load with local_files_only
    OUT/data/train-00000.parquet    input_ids = prompt + completion sampled from the target,
                                    loss_mask = 0 on the prompt, 1 on the completion
    OUT/data/eval/prompts.jsonl     held-out prompts {"input_ids": [...]} for dflash-eval
Everything is deterministic from --seed.
"""

import argparse
import json
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from flashfleet.contract import layout

PAD = 0


class PhraseLanguage:
    def __init__(self, vocab_size: int, seed: int, num_phrases: int = 40, dominant: float = 0.75):
        rng = np.random.default_rng([seed, 1])
        self.rng = np.random.default_rng([seed, 2])
        usable = np.arange(1, vocab_size - 1)  # 0 = pad, vocab-1 = the drafter's mask row
        self.phrases = [rng.choice(usable, size=int(rng.integers(3, 9)), replace=False) for _ in range(num_phrases)]
        self.succ = np.full((num_phrases, num_phrases), (1 - dominant) / (num_phrases - 1))
        for i in range(num_phrases):
            self.succ[i, (i * 7 + 3 + int(rng.integers(0, num_phrases - 1))) % num_phrases] = dominant
        self.succ /= self.succ.sum(1, keepdims=True)

    def sample(self, length: int) -> np.ndarray:
        out, p = [], int(self.rng.integers(len(self.phrases)))
        while len(out) < length + 4:
            out.extend(self.phrases[p].tolist())
            p = int(self.rng.choice(len(self.phrases), p=self.succ[p]))
        start = int(self.rng.integers(0, 4))  # do not always start on a phrase boundary
        return np.asarray(out[start:start + length], dtype=np.int64)


def make_target(vocab_size, hidden, layers, seed):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden // 4, max_position_embeddings=1024, tie_word_embeddings=False,
                      pad_token_id=PAD, bos_token_id=None, eos_token_id=None)
    return Qwen3ForCausalLM(cfg)


def make_hybrid_target(vocab_size, hidden, layers, seed):
    """(text CausalLM to train and sample, the multimodal config to save it under): a tiny
    Qwen3.5 text model (layer_types: linear x3, full, repeated; partial RoPE 0.25 with mRoPE
    sections; untied head) and a tiny vision tower beside it."""
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM

    heads, head_dim = 4, hidden // 4
    rotary_half = int(head_dim * 0.25) // 2
    sections = [rotary_half - 2 * (rotary_half // 3), rotary_half // 3, rotary_half // 3]
    text = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
                linear_conv_kernel_dim=4, max_position_embeddings=1024, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": sections, "mrope_interleaved": True},
                pad_token_id=PAD, bos_token_id=None, eos_token_id=None)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(cfg.text_config), cfg


def save_wrapped(text_model, cfg, path, seed, shard_kb=400):
    """Save a trained text CausalLM as the multimodal checkpoint `cfg` describes, keyed like the
    real one (model.language_model.*, model.visual.*, lm_head.weight), sharded with an index."""
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed + 1)
    wrapped = Qwen3_5ForConditionalGeneration(cfg)
    wrapped.model.language_model.load_state_dict(text_model.model.state_dict())
    wrapped.lm_head.load_state_dict(text_model.lm_head.state_dict())
    wrapped.save_pretrained(path, max_shard_size=f"{shard_kb}KB")


def train_target(model, lang, steps, batch, seq_len, lr=3e-3, log=print):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / steps))
    model.train()
    for step in range(steps):
        x = torch.from_numpy(np.stack([lang.sample(seq_len) for _ in range(batch)]))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"tiny target step {step}: loss {loss.item():.3f}")
    model.eval()
    return float(loss.detach())


@torch.no_grad()
def sample(model, prompts, new_tokens, seed):
    """Sample completions (temperature 1, full distribution) with the KV cache."""
    torch.manual_seed(seed)
    return model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0, top_p=1.0,
                          temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=PAD)


ARCHS = ("qwen3", "qwen3_5")



def write_train_data(data_dir: Path, rows: list[list[int]], prompt_len: int) -> None:
    """The drafter's training data (data_dir/train-00000.parquet, and data_dir/eval/ for the
    prompts): each row a prompt and the target's sampled completion, supervised on the completion."""
    (data_dir / layout.EVAL_PROMPTS).parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32())),
                      "loss_mask": pa.array([[0] * prompt_len + [1] * (len(r) - prompt_len) for r in rows],
                                            pa.list_(pa.int8()))})
    pq.write_table(table, data_dir / "train-00000.parquet")


@contextmanager
def one_thread():
    """torch on one thread inside, its previous count restored after: for the tiny assets' builds.
    Their ops are small: a second thread only adds synchronization, and when the machine's other
    core is busy (a test suite beside the build) an OpenMP pool of two waits on a descheduled thread
    at every op. Measured on 2 cores, the qwen3 assets: 33 s with 2 threads and 46 s with 1 on a
    quiet machine, 330 s and 47 s with one core kept busy. One thread also makes the result the same
    on every machine (one floating-point reduction order)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build(out, seed=0, vocab=256, hidden=128, layers=4, steps=150, num_seqs=512, prompt_len=16,
          completion_len=80, num_eval=48, log=print, arch="qwen3"):
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {ARCHS}")
    t0 = time.time()
    with one_thread():
        return _build(Path(out), seed, vocab, hidden, layers, steps, num_seqs, prompt_len, completion_len, num_eval,
                      log, arch, t0)


def _build(out, seed, vocab, hidden, layers, steps, num_seqs, prompt_len, completion_len, num_eval, log, arch, t0):
    lang = PhraseLanguage(vocab, seed)
    if arch == "qwen3_5":
        model, wrapped_cfg = make_hybrid_target(vocab, hidden, layers, seed)
    else:
        model = make_target(vocab, hidden, layers, seed)
    loss = train_target(model, lang, steps, batch=32, seq_len=prompt_len + completion_len, log=log)
    (out / "model").mkdir(parents=True, exist_ok=True)
    if arch == "qwen3_5":
        save_wrapped(model, wrapped_cfg, out / "model", seed)
    else:
        model.save_pretrained(out / "model")

    rows = []
    for s in range(0, num_seqs, 512):
        n = min(512, num_seqs - s)
        prompts = torch.from_numpy(np.stack([lang.sample(prompt_len) for _ in range(n)]))
        rows += sample(model, prompts, completion_len, seed * 1000 + s).tolist()
    write_train_data(out / "data", rows, prompt_len)
    with open(out / "data" / layout.EVAL_PROMPTS, "w") as f:
        for _ in range(num_eval):
            f.write(json.dumps({"input_ids": lang.sample(prompt_len).tolist()}) + "\n")
    info = {"arch": arch, "seed": seed, "vocab_size": vocab, "hidden_size": hidden, "num_layers": layers, "train_steps": steps,
            "final_lm_loss": loss, "num_sequences": num_seqs, "seconds": round(time.time() - t0, 1)}
    (out / "tiny.json").write_text(json.dumps(info, indent=1) + "\n")
    log(f"tiny assets in {out}: model/, data/ ({num_seqs} sequences), data/eval/prompts.jsonl "
        f"({num_eval} prompts), {info['seconds']} s")
    return info


def main(argv=None):
    p = argparse.ArgumentParser(prog="dflash-tiny", description="Write a tiny target (OUT/model) and data "
                                "sampled from it (OUT/data) for CPU runs and tests. Deterministic from --seed.")
    p.add_argument("out")
    p.add_argument("--arch", choices=ARCHS, default="qwen3",
                   help="qwen3: a Qwen3ForCausalLM; qwen3_5: the hybrid Qwen3.5/3.6 layout in miniature "
                        "(Gated-DeltaNet + full attention, multimodal wrapper with a tiny vision tower, sharded)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=150)
    p.add_argument("--num-sequences", type=int, default=512)
    p.add_argument("--completion-len", type=int, default=80)
    a = p.parse_args(argv)
    build(a.out, seed=a.seed, vocab=a.vocab_size, hidden=a.hidden_size, layers=a.num_layers, steps=a.train_steps,
          num_seqs=a.num_sequences, completion_len=a.completion_len, arch=a.arch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
