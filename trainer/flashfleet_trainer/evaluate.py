"""Real acceptance length tau: greedy speculative decoding of the target with the drafter.

One cycle: the anchor is the last committed token (at first the target's own first token after
the prompt); the drafter proposes B-1 tokens from the target's features of every position
before the anchor; the target scores [anchor, drafts] in one pass; the longest prefix of drafts
equal to the target's greedy choices is accepted, plus one bonus token from the target. tau =
committed tokens / cycles, bonus included, so 1 <= tau <= B. This is the number that matters
("fixed ground truth" offline accuracies overestimate nothing and underestimate tau by ~1).

`dflash-eval --drafter DIR` measures a DFlash directory (dflash-export's output, or a published
drafter of the same format) the same way.

No KV cache: every cycle re-runs the target on the whole sequence. That is exact (and simple)
and fast enough for evaluation-sized prompts; speed here is not what is being measured.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from .data import Blocks
from .loss import IGNORE
from .model import (
    DFlashDrafter,
    DrafterConfig,
    default_mask_token_id,
    default_target_layers,
    drafter_hidden,
    text_config_of,
)


def load_prompts(path, limit=None) -> list[list[int]]:
    prompts = []
    with open(path) as f:
        for line in f:
            if line.strip():
                prompts.append([int(t) for t in json.loads(line)["input_ids"]])
            if limit is not None and len(prompts) >= limit:
                break
    return prompts


@torch.no_grad()
def draft_block(drafter, embed_weight, lm_head_weight, feats, seq, anchor, block_size, mask_token_id):
    """Greedy drafts for positions anchor+1 .. anchor+B-1 (list of B-1 token ids)."""
    ids = torch.full((1, block_size), mask_token_id, dtype=torch.long)
    ids[0, 0] = seq[anchor]
    blocks = Blocks(seq=torch.zeros(1, dtype=torch.long), anchor=torch.tensor([anchor]), input_ids=ids,
                    labels=torch.full_like(ids, IGNORE), teacher_pos=torch.zeros_like(ids))
    hidden = drafter_hidden(drafter, embed_weight, feats, blocks)
    logits = hidden[0, 1:] @ lm_head_weight.t().to(hidden.dtype)
    return logits.argmax(-1).tolist()


@torch.no_grad()
def speculative_tau(producer, drafter, prompts, block_size, max_new_tokens=64, mask_token_id=None, trace=None):
    """Mean tau over prompts (total committed / total cycles) and per-prompt details. With a list
    `trace`, one dict per prompt is appended to it: `drafts` (each cycle's B-1 proposals),
    `committed` (tokens committed per cycle, bonus included) and `output` (the generated tokens,
    the target's first token included)."""
    drafter.eval()
    embed, head = producer.embed_weight, producer.lm_head_weight
    mask_id = drafter.config.mask_token_id if mask_token_id is None else mask_token_id
    total_tokens = total_cycles = 0
    per_prompt = []
    for prompt in prompts:
        seq = list(prompt)
        feats, last = producer.forward(torch.tensor([seq]))
        seq.append(int((last[0, -1] @ head.t()).argmax()))  # the target's first token: the first anchor
        tokens = cycles = 0
        record = {"drafts": [], "committed": []}
        while tokens < max_new_tokens:
            anchor = len(seq) - 1
            drafts = draft_block(drafter, embed, head, feats, seq, anchor, block_size, mask_id)
            feats, last = producer.forward(torch.tensor([seq + drafts]))
            greedy = (last[0, anchor:anchor + block_size] @ head.t()).argmax(-1).tolist()
            n = 0
            while n < block_size - 1 and drafts[n] == greedy[n]:
                n += 1
            seq += drafts[:n] + [greedy[n]]
            tokens += n + 1
            cycles += 1
            record["drafts"].append(drafts)
            record["committed"].append(n + 1)
        if trace is not None:
            trace.append({**record, "output": seq[len(prompt):]})
        total_tokens += tokens
        total_cycles += cycles
        per_prompt.append(tokens / cycles)
    drafter.train()
    return {"tau": total_tokens / max(1, total_cycles), "prompts": len(prompts), "cycles": total_cycles,
            "tokens": total_tokens, "block_size": block_size, "per_prompt": per_prompt}


def load_exported_drafter(path, target_model, device="cpu") -> DFlashDrafter:
    """A drafter from a DFlash directory (dflash-export's, or a published one), checked against the
    target it will run with. Raises ConfigError."""
    from .export import check_target, load_dflash_dir, target_facts

    cfg, state = load_dflash_dir(path)
    check_target(cfg, target_facts(target_model), f"drafter {path}")
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(state)
    return drafter.to(device).eval()


def main(argv=None):
    from .checkpoint import complete_checkpoints
    from .config import EX_CONFIG, ConfigError
    from .model import HiddenStateProducer, load_drafter

    p = argparse.ArgumentParser(prog="dflash-eval", description="Measure the real acceptance length tau of a "
                                "drafter checkpoint by greedy speculative decoding with the target (CPU or one GPU).")
    p.add_argument("--target-model", required=True)
    p.add_argument("--checkpoint", default=None, help="checkpoint dir (default: newest complete in --output-dir)")
    p.add_argument("--output-dir", default=None, help="a run directory; its newest complete checkpoint is used")
    p.add_argument("--drafter", default=None, metavar="DIR", help="a DFlash drafter directory (dflash-export's "
                   "OUT_DIR, or a published one: config.json + model.safetensors) instead of a checkpoint")
    p.add_argument("--random-drafter", action="store_true", help="evaluate an untrained drafter (the baseline)")
    p.add_argument("--block-size", type=int, default=16, help="with --random-drafter")
    p.add_argument("--num-draft-layers", type=int, default=2, help="with --random-drafter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", required=True, help="JSONL of {\"input_ids\": [...]}")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    if a.random_drafter:
        from transformers import AutoConfig

        tcfg = AutoConfig.from_pretrained(a.target_model, local_files_only=True)
        text = text_config_of(tcfg)  # the language model's config (Qwen3.5/3.6 nest it)
        torch.manual_seed(a.seed)
        cfg = DrafterConfig.from_target(tcfg, num_draft_layers=a.num_draft_layers, block_size=a.block_size,
                                        target_layer_ids=default_target_layers(text.num_hidden_layers, a.num_draft_layers),
                                        mask_token_id=default_mask_token_id(text.vocab_size))
        drafter = DFlashDrafter(cfg).to(a.device)
    elif a.drafter:
        try:
            drafter = load_exported_drafter(a.drafter, a.target_model, a.device)
        except ConfigError as e:
            print(e.line(), file=sys.stderr)
            return EX_CONFIG
    else:
        ckpt = a.checkpoint
        if ckpt is None:
            found = complete_checkpoints(Path(a.output_dir or ".") / "checkpoints")
            if not found:
                print("dflash-eval: no complete checkpoint found", file=sys.stderr)
                return 78
            ckpt = found[-1]
        drafter = load_drafter(ckpt, a.device)
    producer = HiddenStateProducer(a.target_model, [a.device], drafter.config.target_layer_ids, a.device)
    res = speculative_tau(producer, drafter, load_prompts(a.prompts, a.num_prompts), drafter.config.block_size,
                          a.max_new_tokens)
    res.pop("per_prompt")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
