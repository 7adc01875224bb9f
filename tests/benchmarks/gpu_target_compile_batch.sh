#!/usr/bin/env bash
# The target with its decoder layers compiled (the trainer's default on CUDA) against the eager
# forward, on one CUDA GPU, from the repository root, into $OUT: the compile test on the GPU, then
# bench_target at the Qwen3-8B shape on varied lengths (length groups: the compiled layers see new
# shapes; recompilations counted), one process per setting, and with WITH_27B=1 at the Qwen3.6-27B
# shape (one 8,192-token sequence, flash-linear-attention). The CUDA lock's transformers and
# flash-linear-attention travel as wheels:
#
#     pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl $(grep -E \
#       '^(transformers|fla-core|flash-linear-attention|huggingface-hub|tokenizers|safetensors|einops|httpx2|httpcore2|hf-xet|click|httpcore|h11|anyio|certifi|idna|sniffio|truststore)==' \
#       requirements/node-cuda.lock | cut -d' ' -f1)
#     OUT=/tmp/out bash tests/benchmarks/gpu_target_compile_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:trainer:kernels:module_utils
log=$OUT/compile.txt
date -u | tee "$log"
python3 -m pytest -q -p no:cacheprovider tests/unit/test_target_compile.py 2>&1 | tail -3 | tee -a "$log"
run() {  # run ARGS...: one bench_target process; its recompilations counted
  echo "== $*" | tee -a "$log"
  TORCH_LOGS=recompiles python3 -m tests.benchmarks.bench_target "$@" 2>"$OUT/err.txt" | grep -E '^\{|^built' | tee -a "$log"
  echo "recompilations: $(grep -c 'Recompiling function' "$OUT/err.txt")" | tee -a "$log"
  grep -E 'Error|error' "$OUT/err.txt" | tail -3 | tee -a "$log"
}
for c in none layers; do run --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512 --warmup 2 --steps 5 --compile $c; done
# The hybrid stack: full-attention layers compiled whole, linear-attention layers in parts.
if [ -n "${WITH_27B:-}" ]; then
  for c in none layers; do run --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 4 --compile $c; done
fi
