#!/usr/bin/env bash
# The drafter step on one CUDA GPU before and after keeping its activations in bf16 between layers,
# with the loss's FP8 teacher (--teacher-fp8) and at the Qwen3.6-27B drafter shape, from the
# repository root, into $OUT: the CUDA tests of the changed paths, then bench_drafter run as
# separate processes, alternating a copy of the old trainer (build/before/trainer, from
# `git archive <base> trainer/flashfleet_trainer`) and this one, with the SM clock and power logged
# (gpu_drafter_common.sh).
#
#     git archive <base> trainer/flashfleet_trainer | tar -x -C build/before
#     OUT=/tmp/out bash tests/benchmarks/gpu_bf16_batch.sh
LOG_NAME=bf16 source tests/benchmarks/gpu_drafter_common.sh
tests tests/unit/test_trainer_attention_cuda.py tests/unit/test_trainer_attention.py tests/kernels/test_trainer_route.py \
  tests/kernels/test_teacher_fp8.py tests/unit/test_trainer_loss.py
d8=(--shape qwen3-8b --attn-impl flex --steps 10 --warmup 3 --repeats 3 --prefetch)
d27=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors 512 --attn-impl flex --steps 10 --warmup 3
     --repeats 3 --prefetch)
for run in 1 2; do for code in before after; do bench $code "${d8[@]}"; done; done
bench after "${d8[@]}" --teacher-fp8
for code in before after; do bench $code "${d27[@]}"; done
bench after "${d27[@]}" --teacher-fp8
