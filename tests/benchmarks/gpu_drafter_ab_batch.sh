#!/usr/bin/env bash
# A drafter change measured on one CUDA GPU by GPU kernel time (the wall-clock rates swing with the
# card's power management; docs/benchmarks.md, "Activations in bf16"), from the repository root,
# into $OUT: the CUDA tests named in $TESTS, then bench_drafter with a kernel-time profile at the
# Qwen3-8B and the Qwen3.6-27B drafter shapes, one process each, alternating a copy of the old
# trainer (build/before/trainer) and this one, $ROUNDS pairs at the 8B shape (2) and one at the 27B
# shape unless NO_27B is set; $EXTRA is added to every bench_drafter's arguments; $CODES names the
# trees of a round ("before after": build/before, then this one; gpu_drafter_common.sh has the rest).
#
#     git archive <base> trainer/flashfleet_trainer | tar -x -C build/before
#     OUT=/tmp/out TESTS="tests/unit/test_trainer_loss.py" bash tests/benchmarks/gpu_drafter_ab_batch.sh
LOG_NAME=drafter_ab source tests/benchmarks/gpu_drafter_common.sh
[ -n "${TESTS:-}" ] && tests $TESTS
d8=(--shape qwen3-8b --attn-impl flex --steps 8 --warmup 3 --prefetch --profile 2 ${EXTRA:-})
d27=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors 512 --attn-impl flex --steps 6 --warmup 3
     --prefetch --profile 2 ${EXTRA:-})
for _ in $(seq "${ROUNDS:-2}"); do for code in "${codes[@]}"; do bench $code "${d8[@]}"; done; done
[ -z "${NO_27B:-}" ] && for code in "${codes[@]}"; do bench $code "${d27[@]}"; done
echo "== done ($(date -u +%T))" | tee -a "$log"
