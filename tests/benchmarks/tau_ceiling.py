"""The acceptance length no drafter can beat at temperature 1 with greedy drafts (vLLM's default
draft_sample_method): the target drafting for itself.

    PYTHONPATH=trainer:module_utils python tests/benchmarks/tau_ceiling.py MODEL PROMPTS.json \
        [--block-size 8] [--max-new-tokens 64] [--seeds 0,1,2]

With greedy drafts a draft is accepted with the target's probability of it (q one-hot: min(1, p/q)
= p(x)), so the best a drafter can propose is the target's own most likely token after the drafts
before it. This script drafts exactly that (the target run greedily for B-1 tokens, one forward a
token) and verifies with flashfleet_trainer.sampling.accept at T = 1, so every committed token is
the target's own sample, as in vLLM. The figure is pooled as vLLM pools it (1 + accepted drafts /
cycles), on the same prompts and token count the label benchmarks judge with, per seed;
the median over seeds and the spread are printed. With drafts sampled from the drafter the ceiling
is the block size (a drafter equal to the target is always accepted), so only the greedy-drafts
protocol has a ceiling below it worth measuring.
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
from flashfleet_trainer.sampling import Sampling, accept, first_token
from transformers import AutoModelForCausalLM


@torch.no_grad()
def oracle_counts(model, prompt, block_size, max_new_tokens, s, gen):
    """(accepted drafts, cycles) of one prompt's generation with the target as its own drafter."""
    ids = list(prompt)
    logits = model(torch.tensor([ids])).logits[0, -1]
    ids.append(first_token(logits, s, gen))
    accepted = cycles = 0
    while len(ids) - len(prompt) < max_new_tokens:
        draft = []
        for _ in range(block_size - 1):  # the target's own greedy continuation
            draft.append(int(model(torch.tensor([ids + draft])).logits[0, -1].argmax()))
        target_logits = model(torch.tensor([ids + draft])).logits[0, len(ids) - 1:]  # [B, V]
        q = torch.nn.functional.one_hot(torch.tensor(draft), target_logits.shape[-1]).float()
        n, token = accept(draft, q, target_logits, s, gen)
        ids += draft[:n] + [token]
        accepted, cycles = accepted + n, cycles + 1
    return accepted, cycles


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("prompts", type=Path, help="a JSON list of token id lists")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    prompts = json.loads(a.prompts.read_text())
    s = Sampling(temperature=1.0, draft_sample_method="greedy")
    taus = []
    for seed in (int(x) for x in a.seeds.split(",")):
        gen = torch.Generator().manual_seed(seed)
        acc = cycles = 0
        for prompt in prompts:
            n, c = oracle_counts(model, prompt, a.block_size, a.max_new_tokens, s, gen)
            acc, cycles = acc + n, cycles + c
        taus.append(1 + acc / cycles)
        print(f"seed {seed}: tau {taus[-1]:.3f} ({acc} drafts accepted in {cycles} cycles, {len(prompts)} prompts)",
              flush=True)
    print(f"T = 1, greedy drafts, the target as its own drafter (block {a.block_size}): tau "
          f"{statistics.median(taus):.3f} ({min(taus):.3f}-{max(taus):.3f}) over {len(taus)} seeds")


if __name__ == "__main__":
    main()
