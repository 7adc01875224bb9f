#!/usr/bin/env bash
# The trainer's step on one CUDA GPU as the anchors per micro-batch grow, from the repository root,
# into $OUT: the Qwen3-8B-shaped target (random weights, full depth, layers compiled) and its
# 5-layer drafter in one process, token budget 65,536 (16 x 4,096), soft labels, the fused loss,
# --max-anchors 512 (the incident's density), 1024 and 2048; one bench_prep.py process each. It
# checks what `--plan`'s headroom line assumes: the target's time per step does not move with the
# anchors and the drafter's grows at most in proportion to its rows.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_anchors_batch.sh
LOG_NAME=anchors source tests/benchmarks/gpu_target_common.sh
start=$SECONDS
Q=/dev/shm/ff/q8
python3 -m flashfleet_trainer.shapes $Q --shape qwen3-8b --seqs 256 --seq-len 4096 > "$OUT/shapes.txt" 2>&1 \
  || { tail -3 "$OUT/shapes.txt"; echo "shapes failed"; exit 1; }
tail -1 "$OUT/shapes.txt" | tee -a "$log"
COMMON=(--target-model $Q/model --data-dir $Q/data --block-size 16 --num-draft-layers 5 --use-soft-labels
        --loss-impl triton --token-budget 65536 --max-seq-len 4096 --eval-num-prompts 0 --save-interval 100000
        --resume never --keep-checkpoints 1 --target-gpus 0 --drafter-gpus 0 --max-steps 8)
for anchors in 512 1024 2048; do
  [ $((SECONDS - start)) -gt 500 ] && { echo "skipped --max-anchors $anchors: out of time" | tee -a "$log"; continue; }
  echo "== --max-anchors $anchors at $((SECONDS - start)) s" | tee -a "$log"
  python3 tests/benchmarks/bench_prep.py -- "${COMMON[@]}" --max-anchors $anchors --output-dir /dev/shm/ff/a$anchors \
    2>"$OUT/a$anchors.err" | tee -a "$log"
done
echo "done at $((SECONDS - start)) s" | tee -a "$log"
