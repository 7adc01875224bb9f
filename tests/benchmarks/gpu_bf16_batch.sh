#!/usr/bin/env bash
# The drafter step on one CUDA GPU before and after keeping its activations in bf16 between layers,
# with the loss's FP8 teacher (--teacher-fp8) and at the Qwen3.6-27B drafter shape, from the
# repository root, into $OUT: the CUDA tests of the changed paths, then bench_drafter run as
# separate processes, alternating a copy of the old trainer (build/before/trainer, from
# `git archive <base> trainer/flashfleet_trainer`) and this one, with the SM clock and power logged.
#
#     git archive <base> trainer/flashfleet_trainer | tar -x -C build/before
#     OUT=/tmp/out bash tests/benchmarks/gpu_bf16_batch.sh
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
now=trainer:kernels:module_utils
before=build/before/trainer:kernels:module_utils
log=$OUT/bf16.txt
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv | tee -a "$log"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 1000 > "$OUT/clocks.csv" &
smi=$!
PYTHONPATH=$now python3 -m pytest -q -s -p no:cacheprovider tests/unit/test_trainer_attention_cuda.py \
  tests/unit/test_trainer_attention.py tests/kernels/test_trainer_route.py tests/kernels/test_teacher_fp8.py \
  tests/unit/test_trainer_loss.py 2>&1 | grep -E "passed|failed|rel\. error|FAILED" | tail -30 | tee -a "$log"
d8=(--shape qwen3-8b --attn-impl flex --steps 10 --warmup 3 --repeats 3 --prefetch)
d27=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors 512 --attn-impl flex --steps 10 --warmup 3
     --repeats 3 --prefetch)
{
  for run in 1 2; do
    for code in before after; do
      pp=$now; [ $code = before ] && pp=$before
      echo "== qwen3-8b $code run $run"
      PYTHONPATH=$pp python3 -m flashfleet_trainer.bench_drafter "${d8[@]}"
    done
  done
  echo "== qwen3-8b after --teacher-fp8"
  PYTHONPATH=$now python3 -m flashfleet_trainer.bench_drafter "${d8[@]}" --teacher-fp8
  echo "== qwen3.6-27b before"
  PYTHONPATH=$before python3 -m flashfleet_trainer.bench_drafter "${d27[@]}"
  echo "== qwen3.6-27b after"
  PYTHONPATH=$now python3 -m flashfleet_trainer.bench_drafter "${d27[@]}"
  echo "== qwen3.6-27b after --teacher-fp8"
  PYTHONPATH=$now python3 -m flashfleet_trainer.bench_drafter "${d27[@]}" --teacher-fp8
} 2>&1 | grep -v Warning | tee -a "$log"
kill "$smi"
