# Sourced by the target benchmarks' GPU batches (gpu_target_profile_batch.sh, gpu_short_conv_batch.sh,
# gpu_e2e_27b_batch.sh, gpu_anchors_batch.sh),
# from the repository root: the CUDA lock's wheels installed from .whl where it has them (see gpu_target_compile_batch.sh
# for the download), the import path, $log under $OUT, a power/clock log beside the runs, and
# `run ARGS...`, one bench_target process whose output goes to $log (step lines left out).
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
if compgen -G '.whl/*.whl' >/dev/null; then  # none: the machine's own transformers (the Qwen3 shapes need no more)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:trainer:kernels:module_utils
log=$OUT/${LOG_NAME:-target}.txt
date -u | tee "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
run() {
  echo "== bench_target $* ($(date -u +%T))" | tee -a "$log"
  python3 -m tests.benchmarks.bench_target "$@" 2>>"$OUT/err.txt" | grep -vE '^(warm-up|step) ' | tee -a "$log"
}
