"""`dflash-tiny-text OUT`: a tiny target trained on real text, and a data set sampled from it.

The phrase-language target of `dflash-tiny` is near-deterministic by design (a trained drafter
reaches ~7.9 of 8): good for fast tests, useless for telling one training setting from another.
This one is trained on real text every machine has offline: the source of a fixed list of
Python standard-library modules (SOURCES, read from this interpreter's
`sysconfig.get_paths()["stdlib"]`). Its continuations are genuinely uncertain, as a real
model's are, so tau lands well inside (1, block size) and differences between drafters show.

Decisions (docs/trainer.md repeats them):
- Files: SOURCES, a fixed sorted list of top-level modules present from Python 3.10 to 3.14
  (pure Python, not shims); a missing one is an error naming it. Split by file: every
  HELD_OUT_EVERY-th of the sorted list is held out; the target never trains on held-out text,
  and the evaluation prompts come only from it. tiny.json records each file's path, size,
  SHA-256 and split, and the interpreter's version (the stdlib text differs between versions).
- Tokens: bytes. id = byte + 1 (1..256), 0 = pad, 257 = the spare row the drafter uses as its
  mask token (vocab_size - 1, the trainer's default for a small vocabulary). No tokenizer to
  train, version or ship, and nothing about the text is hidden by a learned merge table.
- Target: a transformers Qwen3ForCausalLM (as dflash-tiny's), or with `--arch qwen3_5` the
  hybrid Qwen3.5/3.6 layout (dflash-tiny's, 4 layers: Gated DeltaNet x3, full attention, saved
  under its multimodal wrapper), trained with a fixed seed on random windows of the training text,
  then sampled at temperature 1 (full distribution) from prompts cut at line starts of the
  training text: those completions are the drafter's data.

Writes the same layout as dflash-tiny, so dflash-train and dflash-eval take it unchanged:
    OUT/model/                      config.json + model.safetensors
    OUT/data/train-00000.parquet    input_ids = prompt + sampled completion, loss_mask 0/1
    OUT/data/eval/prompts.jsonl     {"set": "stdlib-heldout", "input_ids": [...]} per prompt
    OUT/tiny.json                   the recipe, the sources and their hashes, the final loss
Deterministic from --seed on a given interpreter (one torch thread, whatever the machine).
"""

import argparse
import hashlib
import json
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
from flashfleet.contract import layout

# torch, pyarrow and transformers are imported where they are used: --list-sources (the cache
# key) stays a fraction of a second.
PAD, OFFSET = 0, 1  # token id = byte + OFFSET
VOCAB = 258  # pad, 256 bytes, the drafter's mask row
EVAL_SET = "stdlib-heldout"
HELD_OUT_EVERY = 5  # sorted index % 5 == 4: held out
SOURCES = (
    "argparse.py", "base64.py", "bisect.py", "calendar.py", "configparser.py", "contextlib.py", "copy.py",
    "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py", "functools.py",
    "glob.py", "gzip.py", "heapq.py", "hmac.py", "inspect.py", "ipaddress.py", "locale.py", "numbers.py",
    "operator.py", "optparse.py", "os.py", "pprint.py", "queue.py", "random.py", "reprlib.py", "sched.py",
    "secrets.py", "selectors.py", "shlex.py", "shutil.py", "signal.py", "socket.py", "statistics.py",
    "string.py", "subprocess.py", "tempfile.py", "textwrap.py", "threading.py", "tokenize.py",
    "traceback.py", "typing.py", "uuid.py", "warnings.py", "weakref.py",
)


def sources(stdlib=None) -> list[dict]:
    """The source files, sorted: {path, bytes, sha256, split}. Raises FileNotFoundError naming a missing one."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    out = []
    for i, name in enumerate(sorted(SOURCES)):
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"dflash-tiny-text: {path} is missing from this interpreter's standard "
                                    "library; use a CPython 3.10-3.14 with its full stdlib source")
        data = path.read_bytes()
        out.append({"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                    "split": "heldout" if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else "train"})
    return out


def encode(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64) + OFFSET


def decode_ids(ids) -> str:
    """Token ids back to text (pad and the mask row dropped), for reading samples."""
    return bytes(int(i) - OFFSET for i in ids if OFFSET <= int(i) < OFFSET + 256).decode("utf-8", "replace")


class Corpus:
    """One split's text as token ids (files joined by a blank line) and the offsets of its line starts."""

    def __init__(self, root: Path, files: list[dict], rng: np.random.Generator):
        self.ids = encode(b"\n\n".join((root / f["path"]).read_bytes() for f in files))
        nl = np.flatnonzero(self.ids == ord("\n") + OFFSET) + 1
        # line starts with something on the line (not blank, not the file's end)
        self.starts = nl[(nl < len(self.ids) - 1)]
        self.starts = self.starts[self.ids[self.starts] != ord("\n") + OFFSET]
        self.rng = rng

    def windows(self, n: int, length: int) -> np.ndarray:
        """n random windows of `length` ids anywhere in the text."""
        at = self.rng.integers(0, len(self.ids) - length, size=n)
        return np.stack([self.ids[a:a + length] for a in at])

    def line_prompts(self, n: int, length: int) -> np.ndarray:
        """n windows of `length` ids, each starting at the beginning of a non-blank line."""
        ok = self.starts[self.starts + length <= len(self.ids)]
        return np.stack([self.ids[a:a + length] for a in self.rng.choice(ok, size=n, replace=False)])


def log_line(text: str) -> None:
    print(text, flush=True)  # progress shows as it happens, also into a file or a pipe


def train_target(model, corpus: Corpus, steps, batch, seq_len, lr=3e-3, log=log_line):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * max(0.05, 1 - s / steps))
    model.train()
    t0, ema = time.time(), None
    for step in range(steps):
        x = torch.from_numpy(corpus.windows(batch, seq_len))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if (step + 1) % 25 == 0 or step == steps - 1:
            el = time.time() - t0
            log(f"tiny text target step {step + 1}/{steps}: loss {ema:.3f} nats/byte, {el:.0f} s elapsed, "
                f"~{el / (step + 1) * (steps - step - 1):.0f} s left")
    model.eval()
    return ema


def heldout_loss(model, corpus: Corpus, n=32, seq_len=256) -> float:
    import torch

    with torch.no_grad():
        x = torch.from_numpy(corpus.windows(n, seq_len))
        return float(model(input_ids=x, labels=x).loss)


# decoder layers by architecture: the Qwen3 target's two are enough for real-text uncertainty; the
# hybrid needs four for one full-attention layer after its three linear-attention ones
LAYERS = {"qwen3": 2, "qwen3_5": 4}


def build(out, seed=0, hidden=128, layers=None, steps=400, batch=16, seq_len=128, num_seqs=384, prompt_len=32,
          completion_len=64, num_eval=48, eval_prompt_len=64, stdlib=None, log=log_line, arch="qwen3"):
    from .tiny import one_thread

    if arch not in LAYERS:
        raise ValueError(f"arch {arch!r} is not one of {tuple(LAYERS)}")
    with one_thread():  # the same result on every machine, and faster beside a busy core
        return _build(Path(out), seed, hidden, layers or LAYERS[arch], steps, batch, seq_len, num_seqs, prompt_len,
                      completion_len, num_eval, eval_prompt_len, stdlib, log, arch)


def _build(out, seed, hidden, layers, steps, batch, seq_len, num_seqs, prompt_len, completion_len, num_eval,
           eval_prompt_len, stdlib, log, arch):
    import torch

    from .tiny import make_hybrid_target, make_target, sample, save_wrapped, write_train_data

    t0 = time.time()
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    files = sources(root)
    train = Corpus(root, [f for f in files if f["split"] == "train"], np.random.default_rng([seed, 1]))
    held = Corpus(root, [f for f in files if f["split"] == "heldout"], np.random.default_rng([seed, 2]))
    log(f"tiny text target: {len(train.ids)} training bytes from {sum(f['split'] == 'train' for f in files)} "
        f"stdlib files, {len(held.ids)} held out; {steps} steps of {batch} x {seq_len} bytes")
    if arch == "qwen3_5":
        model, wrapped_cfg = make_hybrid_target(VOCAB, hidden, layers, seed)
    else:
        model = make_target(VOCAB, hidden, layers, seed)
    loss = train_target(model, train, steps, batch, seq_len, log=log)
    held_loss = heldout_loss(model, held)
    log(f"tiny text target: held-out loss {held_loss:.3f} nats/byte; sampling {num_seqs} completions")
    (out / "model").mkdir(parents=True, exist_ok=True)
    if arch == "qwen3_5":
        save_wrapped(model, wrapped_cfg, out / "model", seed)
    else:
        model.save_pretrained(out / "model")

    rows = []
    prompts = train.line_prompts(num_seqs, prompt_len)
    for s in range(0, num_seqs, 128):  # 128 at a time: bounded memory
        rows += sample(model, torch.from_numpy(prompts[s:s + 128]), completion_len, seed * 1000 + s).tolist()
    write_train_data(out / "data", rows, prompt_len)
    with open(out / "data" / layout.EVAL_PROMPTS, "w") as f:
        for p in held.line_prompts(num_eval, eval_prompt_len):
            f.write(json.dumps({"set": EVAL_SET, "input_ids": p.tolist()}) + "\n")
    info = {"kind": "text", "arch": arch, "seed": seed, "tokens": "bytes: id = byte + 1, 0 = pad, 257 = mask row",
            "vocab_size": VOCAB, "hidden_size": hidden, "num_layers": layers, "train_steps": steps,
            "batch": batch, "seq_len": seq_len, "final_lm_loss": loss, "heldout_lm_loss": held_loss,
            "num_sequences": num_seqs, "prompt_len": prompt_len, "completion_len": completion_len,
            "num_eval": num_eval, "eval_prompt_len": eval_prompt_len, "python": sys.version.split()[0],
            "sources": files, "seconds": round(time.time() - t0, 1)}
    (out / "tiny.json").write_text(json.dumps(info, indent=1) + "\n")
    log(f"tiny text assets in {out}: model/, data/ ({num_seqs} sequences), data/eval/prompts.jsonl "
        f"({num_eval} held-out prompts), {info['seconds']} s")
    return info


def main(argv=None):
    p = argparse.ArgumentParser(prog="dflash-tiny-text", description="Write a tiny Qwen3 (or hybrid Qwen3.5) target trained on Python "
                                "standard-library source (OUT/model), completions sampled from it (OUT/data) and "
                                "held-out prompts (OUT/data/eval/prompts.jsonl). Deterministic from --seed.")
    p.add_argument("out", nargs="?")
    p.add_argument("--arch", choices=tuple(LAYERS), default="qwen3",
                   help="qwen3: a 2-layer Qwen3ForCausalLM; qwen3_5: the hybrid Qwen3.5/3.6 layout, 4 layers "
                        "(Gated-DeltaNet x3, full attention), saved under its multimodal wrapper")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-steps", type=int, default=400)
    p.add_argument("--num-sequences", type=int, default=384)
    p.add_argument("--list-sources", action="store_true",
                   help="print `sha256 path split` of each source file and exit (what the cache key hashes)")
    a = p.parse_args(argv)
    try:
        files = sources()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 78
    if a.list_sources:
        for f in files:
            print(f"{f['sha256']} {f['path']} {f['split']}")
        return 0
    if not a.out:
        p.error("OUT is required")
    build(a.out, seed=a.seed, steps=a.train_steps, num_seqs=a.num_sequences, arch=a.arch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
