#!/usr/bin/env bash
# The target's forward on one CUDA GPU with its memory-bound ops compiled and with another attention
# backend first, from the repository root, into $OUT: bench_target at the Qwen3-8B shape (8 x 8,192
# tokens, every layer, random weights), one process per setting, the plain forward first and last
# as the anchor, with the SM clock and power logged.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_target_fuse_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=trainer:kernels:module_utils
log=$OUT/target.txt
date -u | tee "$log"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 1000 > "$OUT/target_clocks.csv" &
smi=$!
t8=(--shape qwen3-8b --seqs 8 --seq-len 8192 --warmup 2 --steps 5)
for setting in "--compile none" "--sdpa cudnn" "--compile parts" "--compile layers" "--compile layers --sdpa cudnn" \
               "--compile none"; do
  echo "== qwen3-8b $setting" | tee -a "$log"
  # shellcheck disable=SC2086
  python3 -m tests.benchmarks.bench_target "${t8[@]}" $setting 2>"$OUT/err.txt" | grep -E '^\{|step 4' | tee -a "$log"
  tail -3 "$OUT/err.txt" | tee -a "$log"
done
kill "$smi"
