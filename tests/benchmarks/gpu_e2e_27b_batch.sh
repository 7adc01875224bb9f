#!/usr/bin/env bash
# The trainer's step with the incident's target, the Qwen3.6-27B shape (random weights, written as
# the real wrapped checkpoint is, loaded through the trainer's own path), at the incident's density
# (token budget 65,536, 512 anchors x block 16, soft labels), target and drafter on one CUDA GPU,
# from the repository root, into $OUT: `shapes` writes the checkpoint (to /dev/shm when it has
# room), then one bench_prep.py process (Trainer.train_step, no checkpoints) for each --max-anchors
# in $ANCHORS (default 512), one process of $STEPS steps each (default 8), each started only while
# under $BUDGET_S seconds (default 400), the SM clock and power logged beside them. Wheels as in
# gpu_target_compile_batch.sh.
#
#     OUT=/tmp/out [ANCHORS="2048 512" STEPS=6] bash tests/benchmarks/gpu_e2e_27b_batch.sh
LOG_NAME=e2e_27b source tests/benchmarks/gpu_target_common.sh
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
free_gib=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
Q=/tmp/ff/q27; [ "$free_gib" -gt 70 ] && Q=/dev/shm/ff/q27
echo "checkpoint under $Q (/dev/shm: ${free_gib} GiB free)" | tee -a "$log"
python3 -m flashfleet_trainer.shapes "$Q" --shape qwen3.6-27b --seqs 96 --seq-len 8192 2>&1 | tail -2 | tee -a "$log" \
  || { echo "shapes failed" | tee -a "$log"; exit 1; }
du -sh "$Q/model" | tee -a "$log"
echo "written at $((SECONDS - start)) s" | tee -a "$log"
for anchors in ${ANCHORS:-512}; do
  [ $((SECONDS - start)) -gt "${BUDGET_S:-400}" ] && { echo "skipped --max-anchors $anchors: out of time" | tee -a "$log"; continue; }
  echo "== --max-anchors $anchors at $((SECONDS - start)) s" | tee -a "$log"
  python3 tests/benchmarks/bench_prep.py -- --target-model "$Q/model" --data-dir "$Q/data" --block-size 16 \
    --num-draft-layers 5 --use-soft-labels --loss-impl triton --token-budget 65536 --max-seq-len 8192 \
    --max-anchors "$anchors" --eval-num-prompts 0 --save-interval 100000 --resume never --keep-checkpoints 1 \
    --target-gpus 0 --drafter-gpus 0 --max-steps "${STEPS:-8}" --output-dir /tmp/ff/run$anchors \
    2>"$OUT/run$anchors.err" | tee -a "$log"
  grep -E 'Error|error' "$OUT/run$anchors.err" | tail -5 | tee -a "$log"
done
rm -rf "$Q"  # 51 GiB, in memory when under /dev/shm
echo "== done at $((SECONDS - start)) s" | tee -a "$log"
