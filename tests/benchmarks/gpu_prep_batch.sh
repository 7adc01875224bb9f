#!/usr/bin/env bash
# The trainer's step on one CUDA GPU before and after preparing each micro-batch's host work ahead,
# from the repository root, into $OUT: bench_prep.py (Trainer.train_step, target and drafter in one
# process) run alternately on a copy of the old trainer (build/prep-before/trainer, from
# `git archive <base> trainer/flashfleet_trainer`) and on this one, 3 processes each, after the
# CUDA attention tests. The target: the Qwen3-8B shape at 8 layers (random weights, shapes.py).
#
#     git archive <base> trainer/flashfleet_trainer | tar -x -C build/prep-before
#     OUT=/tmp/out bash tests/benchmarks/gpu_prep_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
export PYTHONUNBUFFERED=1
KERNELS=${KERNELS:-kernels}  # e.g. a clean `git archive` copy when kernels/ has edits in progress
now=$SITE:trainer:$KERNELS:module_utils
before=$SITE:build/prep-before/trainer:$KERNELS:module_utils
Q=/dev/shm/ff/q3
date -u | tee "$OUT/prep.txt"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv | tee -a "$OUT/prep.txt"
PYTHONPATH=$now python3 -m flashfleet_trainer.shapes $Q --shape qwen3-8b --layers 8 --seqs 48 --seq-len 4096 \
  2>&1 | tail -2 | tee -a "$OUT/prep.txt"
PYTHONPATH=$now python3 -m pytest -q -p no:cacheprovider tests/unit/test_trainer_attention_cuda.py 2>&1 | tail -5 \
  | tee -a "$OUT/prep.txt"
COMMON=(--target-model $Q/model --data-dir $Q/data --block-size 16 --num-draft-layers 5 --use-soft-labels
        --loss-impl triton --token-budget 8192 --max-seq-len 4096 --max-anchors 512 --eval-num-prompts 0
        --save-interval 100000 --resume never --keep-checkpoints 1 --target-gpus 0 --drafter-gpus 0 --max-steps 14)
for run in 1 2 3; do
  for code in before after; do
    pp=$now; [ $code = before ] && pp=$before
    extra=(); [ $code = after ] && [ $run = 3 ] && extra=(--sync-check)
    echo "== $code run $run" | tee -a "$OUT/prep.txt"
    PYTHONPATH=$pp python3 tests/benchmarks/bench_prep.py "${extra[@]}" -- "${COMMON[@]}" --output-dir /dev/shm/ff/$code$run \
      2>"$OUT/$code$run.err" | tee -a "$OUT/prep.txt"
  done
done
