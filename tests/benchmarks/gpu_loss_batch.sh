#!/usr/bin/env bash
# The fused loss's whole GPU batch in one go, on one CUDA machine, from the repository root:
# the peers from wheels carried in .whl/peers (liger-kernel 0.8.5, speculators 0.9.0,
# cut-cross-entropy 25.1.1; `pip download --no-deps -d .whl/peers ...` where PyPI is reachable),
# the CUDA numerics tests, the launch sweep and the benchmark grids with every anchor, into $OUT.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_loss_batch.sh [anchor.py]
#
# anchor.py (optional): another copy of distill_loss.py, e.g. `git show HEAD~1:kernels/...`, timed
# beside the current one in the same process.
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
ANCHOR=${1:-}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers .whl/peers/*.whl || exit 1
export PYTHONPATH=/tmp/peers:kernels:trainer:module_utils PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
ours=ours
[ -n "$ANCHOR" ] && ours="ours,ours@$ANCHOR"
bench() { python3 -m tests.benchmarks.bench_loss "$@"; }
{
  bench --n 8192 --v 151936 --sweep --impls "$ours" --reps 6
  echo "## T=2, kl_weight 0.7: ours, anchor, Liger (and bf16 eager at the issue's shape)"
  bench --impls "$ours,liger" --breakdown --reps 10
  bench --n 8192 --v 151936 --impls "$ours,eager" --reps 6
  echo "## KL only at T=1 (speculators has no temperature)"
  bench --n 4096 8192 --temperature 1 --kl-weight 1 --impls "$ours,speculators" --reps 10
  echo "## CE only (Cut Cross-Entropy)"
  bench --n 4096 8192 16384 --kl-weight 0 --impls "$ours,cce" --reps 10
} 2>&1 | tee "$OUT/bench.txt"
python3 -m pytest -q -p no:cacheprovider tests/kernels tests/unit/test_trainer_attention_cuda.py 2>&1 | tee "$OUT/tests.txt"
