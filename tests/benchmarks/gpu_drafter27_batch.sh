#!/usr/bin/env bash
# The Qwen3.6-27B drafter shape (hidden 5120, MLP 17,408, V = 248,320, sliding window) on one CUDA
# GPU, from the repository root, into $OUT: the CUDA tests named in $TESTS, the cuBLAS GEMM rate at
# the loss's chunk shapes, then one process of this tree's bench_drafter per tree in $CODES ("after":
# this tree; any other name: a copy in build/NAME with its own trainer/ and kernels/, which must hold
# the modules the benchmark imports), each with a kernel-time
# profile; $PLAIN set adds the plain PyTorch step (dense SDPA mask, the loss in torch, the
# norms and activations op by op, foreach AdamW) of the first tree; $MORE_ANCHORS, anchor counts at which the
# first tree runs again (without a profile); $EXTRA is added to every run.
#
#     rm -rf build/head; mkdir -p build/head
#     git archive HEAD trainer/flashfleet_trainer kernels/flashfleet_kernels | tar -x -C build/head
#     OUT=/tmp/out CODES="head after" PLAIN=1 bash tests/benchmarks/gpu_drafter27_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log=$OUT/drafter27.txt
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
if [ -n "${TESTS:-}" ]; then
  PYTHONPATH=trainer:kernels:module_utils timeout "${TESTS_S:-150}" python3 -m pytest -q -s -p no:cacheprovider $TESTS 2>&1 \
    | tee "$OUT/tests.txt" | grep -E "passed|failed|FAILED|Error|skipped" | tail -20 | tee -a "$log"
fi
[ -n "${GEMM:-}" ] && PYTHONPATH=kernels timeout 60 python3 tests/benchmarks/gemm_ceiling.py --d 5120 --v 248320 2>&1 | tail -12 | tee -a "$log"
shape=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2)
timed=(--attn-impl flex --steps "${STEPS:-6}" --warmup 3 --repeats "${REPEATS:-2}" --prefetch ${EXTRA:-})
bench() {
  local code=$1; shift
  local pp=trainer:kernels:module_utils; [ "$code" != after ] && pp=build/$code/trainer:build/$code/kernels:module_utils
  echo "== $code: bench_drafter $* ($(date -u +%T))" | tee -a "$log"
  PYTHONPATH=$pp timeout "${BENCH_S:-150}" python3 -m tests.benchmarks.bench_drafter "$@" 2>>"$OUT/err.txt" \
    | tee -a "$OUT/full.txt" | grep -E '^\{|GPU kernel time|GPU idle|^\| [0-9.]+% \| [a-zA-Z(]+[^|]*\|$|^ +[0-9.]+% ' \
    | tee -a "$log"
}
for code in ${CODES:-head after}; do bench "$code" "${shape[@]}" --anchors "${ANCHORS:-512}" "${timed[@]}" --profile "${PROFILE:-2}"; done
for n in ${MORE_ANCHORS:-}; do  # the first tree of $CODES at other anchor counts (rows = anchors x 16)
  bench "${CODES%% *}" "${shape[@]}" --anchors "$n" "${timed[@]}"
done
if [ -n "${PLAIN:-}" ]; then
  bench "${CODES%% *}" "${shape[@]}" --anchors "${ANCHORS:-512}" --attn-impl dense \
    --loss-impl torch --eager-elementwise --fused-adamw off --steps 3 --warmup 1 --no-launch-ahead
fi
echo "== done ($(date -u +%T))" | tee -a "$log"
