#!/usr/bin/env bash
# Two trainer measurements for one CUDA GPU, from the repository root, into $OUT:
#  1. tau with and without the fused loss's FP8 teacher GEMM (`--teacher-fp8`) on the real-text
#     tiny target (bench_tau_settings.py, four seeds), the run that decides that flag's default;
#  2. the trainer's step at the incident's density (token budget 65,536, 512 anchors x block 16)
#     with the full-depth Qwen3-8B-shaped target (random weights) compiled (`--target-compile
#     auto`, the default) and eager (`off`), alternating, one bench_prep.py process each.
# The tiny text target is built here (`platform/tiny-assets.sh 0 text`) and carried as ASSETS; the
# CUDA lock's transformers travels as wheels in .whl (gpu_target_compile_batch.sh says how).
#
#     OUT=/tmp/out ASSETS=.cache/tiny-text-<key> bash tests/benchmarks/gpu_e2e_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
ASSETS=${ASSETS:?set ASSETS to a dflash-tiny-text output}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:trainer:kernels:module_utils
log=$OUT/e2e.txt
start=$SECONDS
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
Q=/dev/shm/ff/q8  # written while the tau runs train (disk and host memory, not the GPU's time)
python3 -m flashfleet_trainer.shapes $Q --shape qwen3-8b --seqs 256 --seq-len 4096 > "$OUT/shapes.txt" 2>&1 &
shapes=$!
python3 tests/benchmarks/bench_tau_settings.py --device cuda --assets "$ASSETS" --seeds 0,1,2,3 --jobs 8 \
  --threads-per-job 2 --settings kl-T2-w0.7-streak,kl-T2-w0.7-streak-fp8 --out /dev/shm/ff/tau \
  --json "$OUT/tau.json" 2>&1 | tee -a "$log"
echo "tau done at $((SECONDS - start)) s" | tee -a "$log"
wait $shapes; tail -1 "$OUT/shapes.txt" | tee -a "$log"
nvidia-smi -lms 500 --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader > "$OUT/clocks.csv" &
smi=$!
COMMON=(--target-model $Q/model --data-dir $Q/data --block-size 16 --num-draft-layers 5 --use-soft-labels
        --loss-impl triton --token-budget 65536 --max-seq-len 4096 --max-anchors 512 --eval-num-prompts 0
        --save-interval 100000 --resume never --keep-checkpoints 1 --target-gpus 0 --drafter-gpus 0 --max-steps 10)
for run in 1 2; do
  for c in off auto; do
    [ $((SECONDS - start)) -gt 440 ] && { echo "skipped $c run $run: out of time" | tee -a "$log"; continue; }
    echo "== target-compile $c run $run at $((SECONDS - start)) s" | tee -a "$log"
    python3 tests/benchmarks/bench_prep.py -- "${COMMON[@]}" --target-compile $c --output-dir /dev/shm/ff/$c$run \
      2>"$OUT/$c$run.err" | tee -a "$log"
  done
done
kill $smi
echo "done at $((SECONDS - start)) s" | tee -a "$log"
