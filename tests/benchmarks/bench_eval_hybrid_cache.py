"""Cost of one draft-verify cycle of dflash-eval on a hybrid target, cached against the uncached oracle.

    PYTHONPATH=trainer:kernels:module_utils python -m tests.benchmarks.bench_eval_hybrid_cache \
        --shape qwen3.6-27b --layers 64 --contexts 512,2048,8192 --cycles 8 --device cuda

A random-weight target at a hybrid shape (`shapes.py`: Gated-DeltaNet x3 then full attention;
--layers keeps that pattern at fewer layers) and an untrained drafter (--draft-layers, block 16).
Each cycle runs the evaluator's session as speculative_tau does (draft, verify [anchor, drafts],
commit), with the number of accepted drafts set by the benchmark, cycling through --accepted
(default 0, 3, 7, 15: one token committed up to the whole block), so every kind of rewind is
timed: the cached session puts each linear layer's state back and re-runs its mixer over the
committed tokens (none when the whole block is accepted), the uncached one re-runs the whole
sequence through the target and the whole context through the drafter. The figure is seconds per
cycle, the mean over --cycles timed cycles after one warm-up cycle, per context length, both modes
in the same process one after the other, and their ratio. Prefill is not timed. --tiny: the same
at dflash-tiny's hybrid shape (a CPU figure in seconds).
"""

import argparse
import json
import platform
import time

import torch
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import CachedSession, UncachedSession
from flashfleet_trainer.shapes import SHAPES
from flashfleet_trainer.target import HiddenStateProducer, default_target_layers

from tests.benchmarks.bench_target import build_target


def _sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def time_cycles(session, prompt, accepted, cycles, dev) -> float:
    """Seconds per cycle (mean of `cycles` after one warm-up), committing accepted[i % len] + 1 tokens."""
    session.start(prompt)
    anchor, spent = int(prompt[-1]), 0.0
    for c in range(cycles + 1):
        _sync(dev)
        t0 = time.perf_counter()
        drafts = session.draft(anchor).argmax(-1).tolist()
        session.verify(anchor, drafts)
        n = accepted[c % len(accepted)]
        session.commit(n + 1)
        _sync(dev)
        if c:
            spent += time.perf_counter() - t0
        anchor = drafts[min(n, len(drafts) - 1)]
    return spent / cycles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[s for s, kw in SHAPES.items() if "linear_num_key_heads" in kw],
                    default="qwen3.6-27b")
    ap.add_argument("--layers", type=int, default=None, help="target layers (default: the shape's)")
    ap.add_argument("--tiny", action="store_true", help="instead of --shape: dflash-tiny's hybrid target shape "
                    "(hidden 128, --layers or 4, vocabulary 256), random weights")
    ap.add_argument("--contexts", default="512,2048", help="prompt lengths, comma-separated")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--accepted", default="0,3,7,15", help="accepted drafts per cycle, cycled through")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--modes", default="uncached,cached")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from flashfleet_trainer.target import linear_attention_kernels

    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    t0 = time.perf_counter()
    if a.tiny:
        from flashfleet_trainer.tiny import make_hybrid_target

        target = make_hybrid_target(256, 128, a.layers or 4, seed=0)[0].to(a.device, dtype).eval()
        text = target.config
    else:
        target, text = build_target(a.shape, a.layers, a.device, dtype)
    layers = default_target_layers(text.num_hidden_layers, a.draft_layers)
    producer = HiddenStateProducer(None, [], layers, a.device, replicas=[(a.device, target)])
    cfg = DrafterConfig.from_target(text, num_draft_layers=a.draft_layers, target_layer_ids=layers,
                                    block_size=a.block_size, mask_token_id=text.vocab_size - 1)
    drafter = DFlashDrafter(cfg).to(a.device, dtype).eval()
    assert CachedSession.supported(producer), "the cached session does not support this target"
    built = time.perf_counter() - t0
    accepted = [min(int(x), a.block_size - 1) for x in a.accepted.split(",")]
    gen = torch.Generator().manual_seed(1)
    sessions = {"uncached": UncachedSession, "cached": CachedSession}
    for ctx in (int(c) for c in a.contexts.split(",")):
        prompt = torch.randint(1, min(151_000, text.vocab_size - 1), (ctx,), generator=gen).tolist()
        row = {"context": ctx}
        for mode in a.modes.split(","):
            with torch.no_grad():
                row[f"{mode}_s_per_cycle"] = round(
                    time_cycles(sessions[mode](producer, drafter, cfg.mask_token_id), prompt, accepted, a.cycles,
                                a.device), 5)
        if "uncached_s_per_cycle" in row and "cached_s_per_cycle" in row:
            row["uncached_over_cached"] = round(row["uncached_s_per_cycle"] / row["cached_s_per_cycle"], 2)
        print(json.dumps(row), flush=True)
    print(json.dumps({"shape": "tiny" if a.tiny else a.shape, "layers": text.num_hidden_layers, "params_b": round(
        sum(p.numel() for p in target.parameters()) / 1e9, 2), "draft_layers": a.draft_layers,
        "block_size": a.block_size, "accepted": accepted, "cycles": a.cycles, "device": a.device,
        "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.machine(),
        "threads": torch.get_num_threads(), "dtype": str(dtype), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "linear_kernels": linear_attention_kernels(),
        "build_s": round(built, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if a.device.startswith("cuda") else None}))


if __name__ == "__main__":
    main()
