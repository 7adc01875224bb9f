#!/usr/bin/env bash
# A hybrid target's short convolution through flash-linear-attention's kernel (`short_conv`) against
# transformers' torch path, on one CUDA GPU, from the repository root, into $OUT: the CUDA tests of
# the changed paths, then bench_target at the Qwen3.6-27B shape (layers compiled as the trainer
# does) one process per setting, alternating, the last with a kernel-time profile; the attention
# backends at the Qwen3-8B shape (torch's own choice first); a power/clock log beside them. Wheels
# as in gpu_target_compile_batch.sh.
#
#     OUT=/tmp/out bash tests/benchmarks/gpu_short_conv_batch.sh
LOG_NAME=short_conv source tests/benchmarks/gpu_target_common.sh
python3 tests/benchmarks/attn_backends.py --seqs 8 --seq-len 8192 2>>"$OUT/err.txt" | tee -a "$log"
python3 -m pytest -q -p no:cacheprovider tests/unit/test_short_conv.py tests/unit/test_target_compile.py 2>&1 \
  | grep -E 'passed|failed|Error|assert' | tail -8 | tee -a "$log"
for conv in fla torch fla; do
  run --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 4 --compile layers --short-conv $conv
done
run --shape qwen3.6-27b --seqs 4 --seq-len 8192 --min-len 512 --warmup 2 --steps 3 --compile layers --profile 1
echo "== done ($(date -u +%T))" | tee -a "$log"
