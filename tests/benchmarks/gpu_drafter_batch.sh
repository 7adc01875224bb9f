#!/usr/bin/env bash
# The drafter step's spread on one CUDA machine, from the repository root, into $OUT: bench_drafter
# run as separate processes (run-to-run spread), each timing its steps --repeats times (spread
# within a process), with and without --prefetch, at the Qwen3-8B and Qwen3.6-27B drafter shapes;
# and the cuBLAS GEMM rate at the fused loss's chunk shapes (tests/benchmarks/gemm_ceiling.py).
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_drafter_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONPATH=kernels:trainer:module_utils PYTHONUNBUFFERED=1
date -u | tee "$OUT/drafter.txt"
python3 tests/benchmarks/gemm_ceiling.py 2>&1 | tee "$OUT/gemm.txt"
d8=(--shape qwen3-8b --attn-impl flex --steps 10 --warmup 3 --repeats 3)
d27=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors 512 --attn-impl flex --steps 10 --warmup 3
     --repeats 3)
{
  for run in 1 2; do echo "qwen3-8b run $run"; python3 -m tests.benchmarks.bench_drafter "${d8[@]}"; done
  for run in 1 2; do echo "qwen3-8b --prefetch run $run"; python3 -m tests.benchmarks.bench_drafter "${d8[@]}" --prefetch; done
  echo "qwen3.6-27b"; python3 -m tests.benchmarks.bench_drafter "${d27[@]}"
  echo "qwen3.6-27b --prefetch"; python3 -m tests.benchmarks.bench_drafter "${d27[@]}" --prefetch
} 2>&1 | grep -v Warning | tee -a "$OUT/drafter.txt"
