#!/usr/bin/env bash
# Where the target's forward spends its GPU time, on one CUDA GPU, from the repository root, into
# $OUT: bench_target --profile (kernel time by kind) at the Qwen3-8B shape (8 x 8,192 tokens, layers
# compiled) and at the Qwen3.6-27B shape (one 8,192-token sequence, compiled as the trainer does,
# flash-linear-attention; SHORT_CONV=torch for transformers' torch convolution, the state before
# `short_conv`); a power/clock log beside them. Wheels as in gpu_target_compile_batch.sh.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_target_profile_batch.sh
LOG_NAME=profile source tests/benchmarks/gpu_target_common.sh
run --shape qwen3-8b --seqs 8 --seq-len 8192 --warmup 2 --steps 3 --compile layers --profile 1
run --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 3 --compile layers --profile 1 \
  --short-conv "${SHORT_CONV:-fla}"
echo "== done ($(date -u +%T))" | tee -a "$log"
