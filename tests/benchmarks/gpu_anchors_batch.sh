#!/usr/bin/env bash
# The trainer's step on one CUDA GPU as the anchors per micro-batch grow, from the repository root,
# into $OUT: the Qwen3-8B-shaped target (random weights, full depth, layers compiled) and its
# 5-layer drafter in one process, token budget 65,536 (16 x 4,096), soft labels, the fused loss,
# --max-anchors 512 (the incident's density), 1024 and 2048; one bench_prep.py process each. It
# checks what `--plan`'s headroom line assumes: the target's time per step does not move with the
# anchors and the drafter's time grows in proportion to its rows. The CUDA lock's transformers
# travels as wheels in .whl (gpu_target_compile_batch.sh says how).
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_anchors_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:trainer:kernels:module_utils
log=$OUT/anchors.txt
start=$SECONDS
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
Q=/dev/shm/ff/q8
python3 -m flashfleet_trainer.shapes $Q --shape qwen3-8b --seqs 256 --seq-len 4096 2>&1 | tail -1 | tee -a "$log"
echo "assets at $((SECONDS - start)) s" | tee -a "$log"
nvidia-smi -lms 500 --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader > "$OUT/clocks.csv" &
smi=$!
COMMON=(--target-model $Q/model --data-dir $Q/data --block-size 16 --num-draft-layers 5 --use-soft-labels
        --loss-impl triton --token-budget 65536 --max-seq-len 4096 --eval-num-prompts 0 --save-interval 100000
        --resume never --keep-checkpoints 1 --target-gpus 0 --drafter-gpus 0 --max-steps 8)
for anchors in 512 1024 2048; do
  [ $((SECONDS - start)) -gt 500 ] && { echo "skipped --max-anchors $anchors: out of time" | tee -a "$log"; continue; }
  echo "== --max-anchors $anchors at $((SECONDS - start)) s" | tee -a "$log"
  python3 tests/benchmarks/bench_prep.py -- "${COMMON[@]}" --max-anchors $anchors --output-dir /dev/shm/ff/a$anchors \
    2>"$OUT/a$anchors.err" | tee -a "$log"
  tail -2 "$OUT/a$anchors.err" | tee -a "$log"
done
kill $smi
echo "done at $((SECONDS - start)) s" | tee -a "$log"
