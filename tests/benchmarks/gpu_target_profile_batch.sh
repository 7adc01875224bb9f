#!/usr/bin/env bash
# Where the target's forward spends its GPU time, on one CUDA GPU, from the repository root, into
# $OUT: bench_target --profile (kernel time by kind) at the Qwen3-8B shape (8 x 8,192 tokens, layers
# compiled) and at the Qwen3.6-27B shape (one 8,192-token sequence, compiled as the trainer does,
# flash-linear-attention; SHORT_CONV=torch for transformers' torch convolution, the state before
# `short_conv`); a power/clock log beside them. Wheels as in gpu_target_compile_batch.sh.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_target_profile_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:trainer:kernels:module_utils
log=$OUT/profile.txt
date -u | tee "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
smi=$!
run() {  # run ARGS...: one bench_target process, profiled
  echo "== bench_target $* ($(date -u +%T))" | tee -a "$log"
  python3 -m flashfleet_trainer.bench_target "$@" 2>>"$OUT/err.txt" | grep -vE '^(warm-up|step) ' | tee -a "$log"
}
run --shape qwen3-8b --seqs 8 --seq-len 8192 --warmup 2 --steps 3 --compile layers --profile 1
run --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 3 --compile layers --profile 1 \
  --short-conv "${SHORT_CONV:-fla}"
echo "== done ($(date -u +%T))" | tee -a "$log"
kill $smi
