#!/usr/bin/env bash
# The target's throughput in one GPU call, from the repository root, into $OUT: at the Qwen3-8B
# shape (8 x 8,192 tokens) and the Qwen3.6-27B shape (one 8,192-token sequence, fla kernels) as a
# soft-label run asks for it (every layer and the final norm), as a CE-only run does (stopping at
# the deepest feature layer), and a micro-batch of varied lengths run in length groups against one
# forward padded to the longest; then the CUDA tests; the SM clock and power logged beside them. Wheels the GPU image lacks come from .whl/{tf,fla}.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_target_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tf/*.whl .whl/fla/*.whl || exit 1
export PYTHONPATH=/tmp/site:kernels:trainer:module_utils PYTHONUNBUFFERED=1
date -u | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > "$OUT/clocks.csv" &
mon=$!
target() { echo "== bench_target $*"; python3 -m tests.benchmarks.bench_target "$@"; }
{
  target --shape qwen3-8b --seqs 8 --seq-len 8192
  target --shape qwen3-8b --seqs 8 --seq-len 8192 --no-soft-labels
  target --shape qwen3-8b --seqs 8 --seq-len 8192
  target --shape qwen3.6-27b --seqs 1 --seq-len 8192
  target --shape qwen3.6-27b --seqs 1 --seq-len 8192 --no-soft-labels
  target --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512 --padded
  target --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512
  target --shape qwen3.6-27b --seqs 4 --seq-len 8192 --min-len 512 --padded --steps 3
  target --shape qwen3.6-27b --seqs 4 --seq-len 8192 --min-len 512 --steps 3
} 2>&1 | grep -v -i warn | tee "$OUT/target.txt"
python3 -m pytest -q -p no:cacheprovider tests/unit tests/kernels -m cuda 2>&1 | tail -15 | tee "$OUT/tests.txt"
kill "$mon"
