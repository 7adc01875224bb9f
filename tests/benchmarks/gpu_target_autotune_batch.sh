#!/usr/bin/env bash
# The target's compiled decoder layers under inductor's max-autotune (Triton GEMM templates searched
# against cuBLAS, the ops around a GEMM fused into its epilogue where a template wins) against the
# default compile, on one CUDA GPU, from the repository root, into $OUT: bench_target at the
# Qwen3-8B shape (8 x 8,192 tokens, every layer, random weights), one process per setting,
# alternating, the autotuned one with a kernel-time profile; $TESTS (CUDA tests) first.
#
#     OUT=/tmp/out TESTS="tests/kernels/test_norm_rope.py" bash tests/benchmarks/gpu_target_autotune_batch.sh
LOG_NAME=autotune source tests/benchmarks/gpu_target_common.sh
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider $TESTS 2>&1 | grep -E 'passed|failed|Error|assert' | tail -12 | tee -a "$log"
fi
t8=(--shape qwen3-8b --seqs 8 --seq-len 8192 --warmup 2 --steps 5 --compile layers)
run "${t8[@]}"
run "${t8[@]}" --compile-mode max-autotune-no-cudagraphs --profile 1
grep -E 'AUTOTUNE|SingleProcess|mm_' "$OUT/err.txt" | sort | uniq -c | sort -rn | head -30 | tee -a "$log"
run "${t8[@]}"
run "${t8[@]}" --compile-mode max-autotune-no-cudagraphs
echo "== done ($(date -u +%T))" | tee -a "$log"
