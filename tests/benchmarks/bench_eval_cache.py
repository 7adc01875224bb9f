"""Cost of one draft-verify cycle of dflash-eval with and without its KV caches, by context length.

    PYTHONPATH=trainer:module_utils python -m tests.benchmarks.bench_eval_cache \
        --contexts 64,512,1536 --new-tokens 32 --runs 3 --threads 1

A random-weight Qwen3-shaped target (--hidden, --layers; --device cuda for a GPU) and an untrained
drafter (block 8, 2 layers): an untrained drafter is rejected at almost every position, so every
cycle commits about one token and the number of cycles is the same in both modes. Each run decodes
one prompt of each context length; the figure is seconds per cycle, the median over --runs, for the
uncached evaluator (the whole sequence through the target, the whole context through the drafter,
every cycle) and the cached one, measured in the same process one after the other, and their
ratio. The two modes' outputs are checked to be equal on the way.
"""

import argparse
import json
import platform
import statistics
import time

import torch
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import speculative_tau
from flashfleet_trainer.target import HiddenStateProducer, default_target_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="64,512,1536", help="prompt lengths, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8, help="attention heads (KV heads: a quarter)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    contexts = [int(c) for c in a.contexts.split(",")]
    torch.manual_seed(0)
    tcfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=3 * a.hidden,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads,
                       num_key_value_heads=max(1, a.heads // 4), head_dim=a.hidden // a.heads, max_position_embeddings=max(contexts) + a.new_tokens + 64,
                       tie_word_embeddings=False)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    target = Qwen3ForCausalLM(tcfg).to(a.device, dtype).eval()
    layers = default_target_layers(a.layers, 2)
    producer = HiddenStateProducer(None, [], layers, a.device, replicas=[(a.device, target)])
    cfg = DrafterConfig.from_target(tcfg, num_draft_layers=2, target_layer_ids=layers, block_size=a.block_size,
                                    mask_token_id=a.vocab - 1)
    drafter = DFlashDrafter(cfg).to(a.device).eval()
    gen = torch.Generator().manual_seed(1)
    rows = []
    for ctx in contexts:
        prompt = [torch.randint(1, a.vocab - 1, (ctx,), generator=gen).tolist()]
        per_cycle = {}
        outputs = {}
        for cache in (False, True):
            times = []
            for _ in range(a.runs + 1):  # the first run warms up
                trace = []
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = speculative_tau(producer, drafter, prompt, a.block_size, a.new_tokens, trace=trace, cache=cache)
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) / res["cycles"])
            per_cycle[cache] = statistics.median(times[1:])
            outputs[cache] = trace
        rows.append({"context": ctx, "cycles": res["cycles"], "uncached_s_per_cycle": round(per_cycle[False], 5),
                     "cached_s_per_cycle": round(per_cycle[True], 5),
                     "cached_over_uncached": round(per_cycle[True] / per_cycle[False], 3),
                     "same_output": outputs[True] == outputs[False]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"device": a.device, "threads": torch.get_num_threads(), "machine": platform.machine(),
                      "torch": torch.__version__, "hidden": a.hidden, "layers": a.layers, "vocab": a.vocab,
                      "block_size": a.block_size, "new_tokens": a.new_tokens, "runs": a.runs}))


if __name__ == "__main__":
    main()
