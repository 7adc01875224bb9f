"""The constants the drafter's and the loss's defaults follow, where they are not the target's own.

Standard library only, below the trainer and the controller: the trainer's drafter, loss and
evaluator apply them, and the run's settings (flashfleet.plan.settings) state them in their help
texts (and so in `dflash-train --help` and docs/trainer.md) and take their choices from them.
"""

# The published DFlash drafters' mask row, a spare row of the target's vocabulary:
# target family -> (its vocabulary rows, the mask row). Another vocabulary: its last row.
SPARE_MASK_ROWS = {"Qwen3": (151936, 151669), "Qwen3.5/3.6": (248320, 248070)}

# The published DFlash drafter for Qwen3.6-27B (SpecForge configs/qwen3.6-27b-dflash.json, z-lab's
# Qwen3.6-27B-DFlash): Qwen3 layers of 32 query / 8 KV heads of 128, sliding x (n-1) then full,
# window 2048. A hybrid Qwen3.5/3.6 target's drafter gets this shape unless flags say otherwise.
HYBRID_DRAFTER = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=2048)

# The published DFlash 2 drafter for Qwen3.8-27B (Hugging Face z-lab/Qwen3.8-27B-DFlash2, revision
# 50307d4c4cde6860d4eee73e2547cd786fe8e8a4, config.json; also published as incoai/Qwen3.8-27B-DFlash2;
# Inco AI, "DFlash 2: Keep Drafting Parallel", 2026-08-18). Qwen3.8-27B is the Qwen3.6-27B
# architecture (qwen3_5, 64 decoder layers), and the drafter keeps HYBRID_DRAFTER's heads and window,
# but every layer is sliding_attention, not causal in the block (is_causal false), block size 8, and
# target layers 5, 19, 33, 47, 61 for its 64 target and 5 draft layers: step 14 from 5 to L-3, where
# DFlash's rule gives 1, 16, 31, 46, 61. No rule for other depths is published, so
# DFLASH2_TARGET_LAYERS holds only that pair and other depths keep DFlash's rule. Its four conv and
# selector settings equal DFLASH2's. A DFlash 2 drafter of a hybrid Qwen3.5/3.6/3.8 target gets this
# shape unless flags say otherwise.
DFLASH2_TARGET_LAYERS = {(64, 5): (5, 19, 33, 47, 61)}  # (target decoder layers, draft layers) -> ids

# --block-size unless given, per drafter kind: DFlash's 16 (z-lab's published DFlash drafters;
# speculators 0.9.0's dflash default), DFlash 2's 8 (the published Qwen3.8-27B DFlash 2 config above;
# speculators 0.9.0 trains dflash2 at 8 unless told otherwise, train/config/schema.py).
BLOCK_SIZE = {"dflash": 16, "dflash2": 8}

# The drafter's MLP width for a MoE target, whose config has no intermediate_size: this many x hidden.
MOE_MLP_PER_HIDDEN = 3

# DFlash's decay gammas (--loss-weighting decay) by block size, largest block first: a block of
# at least that size takes that gamma; a block smaller than all of them takes the last one.
DECAY_GAMMAS = ((16, 7.0), (10, 5.0), (8, 4.0))

# dflash-eval --random-drafter's draft layers unless given: an untrained drafter's tau does not
# grow with its depth, and fewer layers evaluate faster.
RANDOM_DRAFTER_LAYERS = 2

# The drafter kinds --drafter-kind takes, named as speculators' and vLLM's configs name them.
DRAFTER_KINDS = ("dflash", "dflash2")

# DFlash 2's settings: speculators 0.9.0's DFlash2SpeculatorConfig defaults (models/dflash2/config.py:
# conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k 16) and its training
# default selector_loss_alpha 1.0 (models/dflash2/core.py, get_trainer_kwargs). z-lab's dflash 0.1.0
# has no defaults of its own (it reads them from the drafter's config.json); the published
# Qwen3.8-27B DFlash 2 config (above) has the same four: these apply to every target.
DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16, selector_loss_alpha=1.0)

# The chat template's thinking switch of an evaluation's prompts (dflash-eval --thinking,
# --eval-thinking; flashfleet_trainer/chat_template.py says what each does).
THINKING_SWITCH = ("on", "off")
# How a sampling evaluation draws the drafter's tokens, named as vLLM's `draft_sample_method`:
# probabilistic (sampled from the drafter's distribution, which the acceptance test reads: z-lab's
# dflash protocol) or greedy (its most likely token, treated as certain: vLLM 0.32.0's default).
DRAFT_SAMPLE_METHODS = ("probabilistic", "greedy")
