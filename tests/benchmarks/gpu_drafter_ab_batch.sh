#!/usr/bin/env bash
# A drafter change measured on one CUDA GPU by GPU kernel time (the wall-clock rates swing with the
# card's power management; docs/benchmarks.md, "Activations in bf16"), from the repository root,
# into $OUT: the CUDA tests named in $TESTS, then bench_drafter with a kernel-time profile at the
# Qwen3-8B and the Qwen3.6-27B drafter shapes, one process each, alternating a copy of the old
# trainer (build/before/trainer) and this one, $ROUNDS pairs at the 8B shape (2) and one at the 27B
# shape unless NO_27B is set; the SM clock and power logged beside them.
#
#     git archive <base> trainer/flashfleet_trainer | tar -x -C build/before
#     OUT=/tmp/out TESTS="tests/unit/test_trainer_loss.py" bash tests/benchmarks/gpu_drafter_ab_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
now=trainer:kernels:module_utils
before=build/before/trainer:kernels:module_utils
log=$OUT/drafter_ab.txt
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
[ -n "${TESTS:-}" ] && PYTHONPATH=$now python3 -m pytest -q -p no:cacheprovider $TESTS 2>&1 \
  | grep -E "passed|failed|FAILED|Error" | tail -10 | tee -a "$log"
d8=(--shape qwen3-8b --attn-impl flex --steps 8 --warmup 3 --prefetch --profile 2)
d27=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors 512 --attn-impl flex --steps 6 --warmup 3
     --prefetch --profile 2)
bench() {  # bench CODE ARGS...: one bench_drafter process of the before or after trainer
  local code=$1; shift
  local pp=$now; [ "$code" = before ] && pp=$before
  echo "== $code: bench_drafter $* ($(date -u +%T))" | tee -a "$log"
  PYTHONPATH=$pp python3 -m flashfleet_trainer.bench_drafter "$@" 2>>"$OUT/err.txt" | tee -a "$OUT/full.txt" \
    | grep -E '^\{|GPU kernel time|^\| [0-9.]+% \| [a-zA-Z(]+[^|]*\|$' | tee -a "$log"
}
for _ in $(seq "${ROUNDS:-2}"); do for code in before after; do bench $code "${d8[@]}"; done; done
[ -z "${NO_27B:-}" ] && for code in before after; do bench $code "${d27[@]}"; done
echo "== done ($(date -u +%T))" | tee -a "$log"
