# Sourced by the drafter's before/after GPU batches (gpu_drafter_ab_batch.sh, gpu_bf16_batch.sh), from
# the repository root: $OUT, $log under it (named by $LOG_NAME), the import paths of this trainer
# ($now) and the trees of $codes ($CODES, default "before after": build/before/trainer, from `git
# archive <base> trainer/flashfleet_trainer | tar -x -C build/before`, then this one), checked
# first, the card and a power/clock log beside the runs, `tests PATHS...` (the CUDA tests of this
# trainer, summary lines to $log) and `bench CODE ARGS...` (one process of this tree's
# tests/benchmarks/bench_drafter.py on this trainer when CODE is "after", else on the copy in
# build/CODE, which must hold the modules the benchmark imports: its JSON line and time shares to
# $log, everything it printed to $OUT/full.txt).
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
now=trainer:kernels:module_utils
codes=(${CODES:-before after})  # the trees a round compares: "after" is this one, any other a copy in build/CODE
for code in "${codes[@]}"; do
  [ "$code" = after ] || [ -d "build/$code/trainer/flashfleet_trainer" ] \
    || { echo "no build/$code/trainer/flashfleet_trainer: make it with git archive (see above)" >&2; exit 1; }
done
log=$OUT/${LOG_NAME:-drafter}.txt
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
tests() {
  PYTHONPATH=$now python3 -m pytest -q -s -p no:cacheprovider "$@" 2>&1 \
    | grep -E "passed|failed|FAILED|Error|rel\. error" | tail -30 | tee -a "$log"
}
bench() {
  local code=$1; shift
  local pp=$now; [ "$code" != after ] && pp=build/$code/trainer:kernels:module_utils
  echo "== $code: bench_drafter $* ($(date -u +%T))" | tee -a "$log"
  PYTHONPATH=$pp python3 -m tests.benchmarks.bench_drafter "$@" 2>>"$OUT/err.txt" | tee -a "$OUT/full.txt" \
    | grep -E '^\{|GPU kernel time|GPU idle|^\| [0-9.]+% \| [a-zA-Z(]+[^|]*\|$' | tee -a "$log"
}
