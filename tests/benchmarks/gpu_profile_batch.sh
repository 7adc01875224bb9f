#!/usr/bin/env bash
# Where the drafter step's GPU time goes, on one CUDA GPU, from the repository root, into $OUT: the
# flex kernel options against inductor's max-autotune choice (bench_flex.py, Qwen3-8B drafter shape),
# then one bench_drafter --profile at the Qwen3-8B and one at the Qwen3.6-27B drafter shape, whose
# tables put the step's small kernels on the host ops that launched them (launch_table).
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_profile_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=trainer:kernels:module_utils
log=$OUT/profile.txt
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
for shape in "--shape qwen3-8b" "--shape qwen3.6-27b --vocab 248320 --seq-len 8192"; do
  echo "== bench_drafter $shape ($(date -u +%T))" | tee -a "$log"
  # shellcheck disable=SC2086  # $shape is several arguments
  python3 -m tests.benchmarks.bench_drafter $shape --attn-impl flex --steps 6 --warmup 3 --prefetch --profile 2 \
    2>>"$OUT/err.txt" | tee -a "$log"
done
echo "== bench_flex ($(date -u +%T))" | tee -a "$log"
python3 tests/benchmarks/bench_flex.py --shape qwen3-8b --autotune 2>>"$OUT/err.txt" | tee -a "$log"
echo "== done ($(date -u +%T))" | tee -a "$log"
