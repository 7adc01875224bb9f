#!/usr/bin/env bash
# The fused loss's final figures in one GPU call, from the repository root, into $OUT: the grid with
# every variant and anchor timed in the same process (an older copy of distill_loss.py as the first
# argument), KL only against speculators, bf16 eager, the CUDA tests, and two bench_drafter processes
# at the Qwen3-8B shape with the SM clock, power and temperature logged beside them.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_final_batch.sh anchor_distill_loss.py
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
ANCHOR=${1:?give an older distill_loss.py as the anchor}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers .whl/peers/*.whl || exit 1
export PYTHONPATH=/tmp/peers:kernels:trainer:module_utils PYTHONUNBUFFERED=1
date -u | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > "$OUT/clocks.csv" &
mon=$!
bench() { python3 -m tests.benchmarks.bench_loss "$@"; }
{
  bench --impls "ours,ours:one_logits_gemm=1,ours@$ANCHOR,liger" --breakdown --reps 10
  bench --n 4096 8192 --temperature 1 --kl-weight 1 --impls "ours,ours:one_logits_gemm=1,speculators" --reps 10
  bench --n 8192 --v 151936 --impls "ours,eager" --reps 6
} 2>&1 | grep -v -i warn | tee "$OUT/bench.txt"
python3 -m pytest -q -p no:cacheprovider tests/kernels -m cuda 2>&1 | tee "$OUT/tests.txt"
for run in 1 2; do
  echo "qwen3-8b run $run $(date -u +%T)"
  python3 -m tests.benchmarks.bench_drafter --shape qwen3-8b --attn-impl flex --steps 10 --warmup 3 --repeats 3 --prefetch
done 2>&1 | grep -v -i warn | tee "$OUT/drafter.txt"
kill "$mon"
