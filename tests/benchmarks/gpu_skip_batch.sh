#!/usr/bin/env bash
# Vocabulary-tile skipping in the fused loss's gradient GEMM: its CUDA tests, the skipping GEMM against
# cuBLAS, and the loss with and without skipping beside every peer, on one CUDA machine, into $OUT.
# Peers from wheels in .whl/peers (liger-kernel 0.8.5, speculators 0.9.0, cut-cross-entropy 25.1.1;
# `pip download --no-deps -d .whl/peers ...` where PyPI is reachable), as in gpu_loss_batch.sh.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_skip_batch.sh          # everything (about 5 minutes)
#     OUT=/tmp/out bash tests/benchmarks/gpu_skip_batch.sh quick    # the skipping tests and GEMM, peaked data only
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
QUICK=${1:-}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers .whl/peers/*.whl || exit 1
export PYTHONPATH=/tmp/peers:kernels:trainer:module_utils PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  date -u
} | tee "$OUT/gpu.txt"
bench() { timeout 240 python3 -m tests.benchmarks.bench_loss "$@"; }
skip=ours:skip_tiles=1
if [ -n "$QUICK" ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_distill_loss_skip.py \
    tests/kernels/test_distill_loss_cuda.py -k "skip" 2>&1 | tee "$OUT/tests.txt"
  {
    bench --skip-gemm --v 151936
    bench --n 8192 --v 151936 --data prior --impls "ours,$skip,liger" --reps 10
    bench --n 8192 --v 151936 --data prior --temperature 1 --kl-weight 1 --impls "ours,$skip,speculators" --reps 10
    bench --n 8192 --v 151936 --data prior --kl-weight 0 --impls "ours,$skip,cce" --reps 10
  } 2>&1 | tee "$OUT/bench.txt"
  exit 0
fi
{
  bench --skip-gemm --v 151936
  for data in flat prior; do
    echo "## T=2, kl_weight 0.7, data=$data: ours, ours skipping tiles, Liger, bf16 eager"
    bench --n 8192 --v 151936 --data $data --impls "ours,$skip,liger,eager" --breakdown --reps 10
    bench --n 16384 --v 248320 --data $data --impls "ours,$skip,liger" --reps 6
    echo "## KL only at T=1, data=$data (speculators has no temperature)"
    bench --n 8192 --v 151936 --data $data --temperature 1 --kl-weight 1 --impls "ours,$skip,speculators" --reps 10
    echo "## CE only, data=$data (Cut Cross-Entropy)"
    bench --n 8192 --v 151936 --data $data --kl-weight 0 --impls "ours,$skip,cce" --reps 10
  done
} 2>&1 | tee "$OUT/bench.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_distill_loss_skip.py tests/kernels/test_distill_loss.py \
  tests/kernels/test_distill_loss_cuda.py -k "skip or bf16_matches or peak_memory or triton_matches" 2>&1 | tee "$OUT/tests.txt"
