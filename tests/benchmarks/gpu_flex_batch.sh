#!/usr/bin/env bash
# The drafter's flex attention under kernel options, on one CUDA GPU, from the repository root, into
# $OUT: bench_flex.py at the Qwen3-8B drafter shape (and the Qwen3.6-27B one unless NO_27B is set),
# inductor's defaults and max-autotune in the same process; then bench_drafter with the fastest
# options of the 8B table against the defaults, one process each, alternating, $ROUNDS pairs (2; a kernel-time
# profile each).
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_flex_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=trainer:kernels:module_utils
log=$OUT/flex.txt
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$log"
python3 tests/benchmarks/bench_flex.py --shape qwen3-8b --autotune 2>>"$OUT/err.txt" | tee "$OUT/flex_8b.jsonl" | tee -a "$log"
[ -z "${NO_27B:-}" ] && python3 tests/benchmarks/bench_flex.py --shape qwen3.6-27b --seq-len 8192 2>>"$OUT/err.txt" \
  | tee "$OUT/flex_27b.jsonl" | tee -a "$log"
best=$(python3 - "$OUT/flex_8b.jsonl" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.startswith("{")]
ok = [r for r in rows if "fwd_bwd_ms" in r and not r["autotune"]]
print(json.dumps(min(ok, key=lambda r: r["fwd_bwd_ms"])["kernel_options"]) if ok else "null")
PY
)
echo "== fastest options at the 8B shape: $best" | tee -a "$log"
d8=(--shape qwen3-8b --attn-impl flex --steps 8 --warmup 3 --prefetch --repeats 3 --profile 3)
for _ in $(seq "${ROUNDS:-2}"); do
  for opts in null "$best"; do
    echo "== bench_drafter --flex-options $opts ($(date -u +%T))" | tee -a "$log"
    python3 -m flashfleet_trainer.bench_drafter "${d8[@]}" --flex-options "$opts" 2>>"$OUT/err.txt" | tee -a "$OUT/full.txt" \
      | grep -E '^\{|GPU kernel time|GPU idle|^\| [0-9.]+% \| [a-zA-Z(]+[^|]*\|$' | tee -a "$log"
  done
done
echo "== done ($(date -u +%T))" | tee -a "$log"
