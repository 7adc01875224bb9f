#!/usr/bin/env bash
# teacher_fp8 (FP8 teacher logits) on one CUDA machine, from the repository root, into $OUT: the
# CUDA tests of the loss (the FP8 ones included), then ours, ours:teacher_fp8=1 and Liger timed in
# one process with --breakdown and the FP8 numerics lines, at one vocabulary per part so that each
# part fits a short GPU call. Liger comes from the wheels carried in .whl/peers (see gpu_loss_batch.sh).
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_fp8_batch.sh [tests] [151936] [248320]   # default: all three
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
parts=${*:-tests 151936 248320}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers .whl/peers/*.whl || exit 1
export PYTHONPATH=/tmp/peers:kernels:trainer:module_utils PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 >> "$OUT/clocks.csv" &
mon=$!
for part in $parts; do
  case $part in
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/kernels/test_teacher_fp8.py tests/kernels/test_distill_loss_cuda.py \
        2>&1 | tee -a "$OUT/tests.txt" ;;
    *)
      echo "## V=$part, T=2, kl_weight 0.7: ours, ours:teacher_fp8=1, Liger ($(date -u +%T))"
      python3 -m tests.benchmarks.bench_loss --n 4096 8192 16384 --v "$part" --impls "ours,ours:teacher_fp8=1,liger" \
        --breakdown --reps 10 2>&1 | grep -v -i warn | tee -a "$OUT/bench.txt" ;;
  esac
done
kill "$mon"
