#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, one named call each, on one CUDA machine:
#
#     OUT=/tmp/out bash tests/benchmarks/gpu.sh NAME [NAME...]   # the calls in order, into $OUT
#     bash tests/benchmarks/gpu.sh list                          # the calls and what each measures
#
# One set-up serves every call: $OUT/gpu.txt (date, card, driver, power limit, torch and triton, the
# tree's commit); the SM clock, power and temperature every 500 ms in $OUT/clocks.csv while the calls
# run (the card's power management moves every rate measured here: read it beside them); the wheels
# carried in .whl (the CUDA lock's transformers and flash-linear-attention, which GPU images lack)
# installed into /tmp/site, and those in .whl/peers (the loss's peers) into /tmp/peers for the calls
# that time them; PYTHONPATH; and the helpers below, which run bench_loss, bench_drafter,
# bench_target, bench_prep.py and the CUDA tests on this tree or on a copy of another commit. Each
# call writes $OUT/NAME.txt (the lines the docs quote) and $OUT/NAME.full.txt / NAME.err.txt
# (everything its programs printed). A call's knobs are environment variables, named above it.
#
# CODES names the trees a before/after call compares: "after" is this tree, any other name a copy
# in build/NAME, with its own kernels/ where it has one (else this tree's):
#     rm -rf build/before && mkdir -p build/before
#     git archive <commit> trainer/flashfleet_trainer [kernels/flashfleet_kernels] | tar -x -C build/before
# The wheels, where PyPI is reachable (the GPU machine is offline; they travel with the tree):
#     pip download --no-deps -d .whl/peers liger-kernel==0.8.5 speculators==0.9.0 cut-cross-entropy==25.1.1
#     pins='transformers|fla-core|flash-linear-attention|huggingface-hub|tokenizers|safetensors|einops|httpx2'
#     pins+='|httpcore2|hf-xet|click|httpcore|h11|anyio|certifi|idna|sniffio|truststore'
#     pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       $(grep -E "^($pins)==" requirements/node-cuda.lock | cut -d' ' -f1)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export PYTHONUNBUFFERED=1
SITE=/tmp/site
SCRATCH=${SCRATCH:-/dev/shm/ff}  # checkpoints and run folders (in memory: the runs read them fast)
PEERS=

# ---- helpers (a call's lines go to $log, everything to $full / $err) ---------------------------

say() { echo "$*" | tee -a "$log"; }
# note "${PIPESTATUS[0]}" after a program's pipeline: its failure fails the call (the greps after it may match nothing)
note() { [ "$1" = 0 ] || { say "  (exit $1)"; failed=1; }; }

tree() {  # tree CODE: the PYTHONPATH of this tree ("after") or of its copy in build/CODE
  local code=$1 k=${KERNELS:-kernels}
  if [ "$code" = after ]; then echo "${PEERS:+$PEERS:}$SITE:trainer:$k:module_utils"; return; fi
  [ -d "build/$code/kernels/flashfleet_kernels" ] && k=build/$code/kernels
  echo "${PEERS:+$PEERS:}$SITE:build/$code/trainer:$k:module_utils"
}

peers() {  # the loss's peers from .whl/peers: liger-kernel 0.8.5, speculators 0.9.0, cut-cross-entropy 25.1.1
  [ -n "$PEERS" ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers .whl/peers/*.whl || return 1
  PEERS=/tmp/peers
}

tests() {  # tests PYTEST-ARGS...: the CUDA tests on this tree, their summary lines to $log
  PYTHONPATH=$(tree after) timeout "${TESTS_S:-0}" python3 -m pytest -q -s -p no:cacheprovider "$@" 2>&1 \
    | tee -a "$full" | grep -E "passed|failed|FAILED|Error|skipped|rel\. error|assert" | tail -30 | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

drafter() {  # drafter CODE ARGS...: one bench_drafter process on tree CODE; its JSON line and time shares to $log
  local code=$1; shift
  say "== $code: bench_drafter $* ($(date -u +%T))"
  PYTHONPATH=$(tree "$code") timeout "${BENCH_S:-0}" python3 -m tests.benchmarks.bench_drafter "$@" 2>>"$err" \
    | tee -a "$full" | grep -E '^\{|GPU kernel time|GPU idle|^\| [0-9.]+% \| [a-zA-Z(]+[^|]*\|$|^ +[0-9.]+% |^host calls|^\| [0-9.]+ \| [0-9]+ \| cuda' \
    | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

target() {  # target ARGS...: one bench_target process on this tree; all but its step lines to $log
  say "== bench_target $* ($(date -u +%T))"
  PYTHONPATH=$(tree after) python3 -m tests.benchmarks.bench_target "$@" 2>>"$err" | tee -a "$full" \
    | grep -vE '^(warm-up|step) ' | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

loss() {  # loss ARGS...: one bench_loss process on this tree (the peers on the path where installed)
  say "== bench_loss $* ($(date -u +%T))"
  PYTHONPATH=$(tree after) timeout "${BENCH_S:-0}" python3 -m tests.benchmarks.bench_loss "$@" 2>&1 \
    | grep -v -i warn | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

prep() {  # prep CODE OUTDIR [bench_prep options] -- FLAGS...: Trainer.train_step on tree CODE, one process
  local code=$1 dir=$2; shift 2
  local e=$OUT/$name.${dir##*/}.err.txt
  say "== $code: bench_prep.py $* ($(date -u +%T))"
  PYTHONPATH=$(tree "$code") python3 tests/benchmarks/bench_prep.py "$@" --output-dir "$dir" 2>"$e" | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  grep -E 'Error|error' "$e" | tail -3 | tee -a "$log"
  note "$rc"
}

shapes() {  # shapes DIR ARGS...: a random-weight checkpoint and data at a real shape, reused while ARGS match
  local dir=$1; shift
  if [ "$(cat "$dir/.args" 2>/dev/null)" = "$*" ]; then say "checkpoint $dir reused ($*)"; return 0; fi
  rm -rf "$dir"
  PYTHONPATH=$(tree after) python3 -m flashfleet_trainer.shapes "$dir" "$@" >>"$full" 2>&1 \
    || { tail -3 "$full"; say "shapes failed"; return 1; }
  echo "$*" >"$dir/.args"
  tail -1 "$full" | tee -a "$log"
}

out_of_time() {  # out_of_time LIMIT_S WHAT: true (and says so) once this call has run LIMIT_S seconds
  [ $((SECONDS - start)) -gt "$1" ] || return 1
  say "skipped $2: out of time"
}

codes() { echo "${CODES:-$1}"; }  # codes DEFAULT: the trees a call compares

# The trainer's flags every bench_prep.py call shares: the 5-layer drafter, block 16, soft labels, the
# fused loss, target and drafter on GPU 0, no evaluation and no checkpoints.
TRAIN=(--block-size 16 --num-draft-layers 5 --use-soft-labels --loss-impl triton --eval-num-prompts 0
       --save-interval 100000 --resume never --keep-checkpoints 1 --target-gpus 0 --drafter-gpus 0)
D8=(--shape qwen3-8b --attn-impl flex)  # the Qwen3-8B drafter shape (bench_drafter's default micro-batch)
# the incident's drafter (Qwen3.6-27B: hidden 5120, V 248,320, sliding window), 2 x 8,192 tokens, 512 anchors
D27=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors 512 --attn-impl flex)
T8=(--shape qwen3-8b --seqs 8 --seq-len 8192)  # the Qwen3-8B target at 8 x 8,192 tokens

# ---- the calls ---------------------------------------------------------------------------------

# loss: the fused loss's whole set: the launch sweep, T=2 / KL 0.7 against Liger and bf16 eager, KL only at
#   T=1 against speculators, CE only against Cut Cross-Entropy, then the loss's and the attention's CUDA
#   tests. ANCHOR: an older distill_loss.py timed beside ours in the same process.
call_loss() {
  peers || return 1
  local ours=ours; [ -n "${ANCHOR:-}" ] && ours="ours,ours@$ANCHOR"
  loss --n 8192 --v 151936 --sweep --impls "$ours" --reps 6
  loss --impls "$ours,liger" --breakdown --reps 10
  loss --n 8192 --v 151936 --impls "$ours,eager" --reps 6
  loss --n 4096 8192 --temperature 1 --kl-weight 1 --impls "$ours,speculators" --reps 10
  loss --n 4096 8192 16384 --kl-weight 0 --impls "$ours,cce" --reps 10
  tests tests/kernels tests/unit/test_trainer_attention_cuda.py
}
ANCHOR_HOW="git show COMMIT:kernels/flashfleet_kernels/distill_loss.py > FILE"
pre_loss() { [ -z "${ANCHOR:-}" ] || [ -f "$ANCHOR" ] || echo "ANCHOR=$ANCHOR is not a file: give an older distill_loss.py ($ANCHOR_HOW)"; }

# loss-final: the loss's grid with every variant beside ANCHOR (an older distill_loss.py, required) and Liger,
#   KL only against speculators, bf16 eager, the CUDA tests, then two bench_drafter processes at the Qwen3-8B
#   shape.
call_loss_final() {
  peers || return 1
  loss --impls "ours,ours:one_logits_gemm=1,ours@$ANCHOR,liger" --breakdown --reps 10
  loss --n 4096 8192 --temperature 1 --kl-weight 1 --impls "ours,ours:one_logits_gemm=1,speculators" --reps 10
  loss --n 8192 --v 151936 --impls "ours,eager" --reps 6
  tests tests/kernels -m cuda
  for _ in 1 2; do drafter after "${D8[@]}" --steps 10 --warmup 3 --repeats 3 --prefetch; done
}
pre_loss_final() { [ -f "${ANCHOR:-}" ] || echo "loss-final needs ANCHOR=FILE, an older distill_loss.py ($ANCHOR_HOW)"; }

# loss-fp8: the FP8 teacher (ours:teacher_fp8=1) against the bf16 loss and Liger, with --breakdown and the FP8
#   numerics lines, one process per vocabulary, and the loss's CUDA tests. PARTS: which, in order (default
#   "tests 151936 248320").
call_loss_fp8() {
  peers || return 1
  local part
  for part in ${PARTS:-tests 151936 248320}; do
    case $part in
      tests) tests tests/kernels/test_teacher_fp8.py tests/kernels/test_distill_loss_cuda.py ;;
      *) loss --n 4096 8192 16384 --v "$part" --impls "ours,ours:teacher_fp8=1,liger" --breakdown --reps 10 ;;
    esac
  done
}

# loss-skip: vocabulary tiles skipped in the gradient GEMM: the skipping GEMM against cuBLAS, the loss with
#   and without skipping beside every peer on flat and peaked data, the CUDA tests. QUICK=1: the skipping
#   tests and GEMM, peaked data only (about 2 minutes).
call_loss_skip() {
  peers || return 1
  local BENCH_S=${BENCH_S:-240} TESTS_S=${TESTS_S:-300} skip=ours:skip_tiles=1 data
  if [ -n "${QUICK:-}" ]; then
    TESTS_S=120 tests tests/kernels/test_distill_loss_skip.py tests/kernels/test_distill_loss_cuda.py -k skip
    loss --skip-gemm --v 151936
    loss --n 8192 --v 151936 --data prior --impls "ours,$skip,liger" --reps 10
    loss --n 8192 --v 151936 --data prior --temperature 1 --kl-weight 1 --impls "ours,$skip,speculators" --reps 10
    loss --n 8192 --v 151936 --data prior --kl-weight 0 --impls "ours,$skip,cce" --reps 10
    return
  fi
  loss --skip-gemm --v 151936
  for data in flat prior; do
    loss --n 8192 --v 151936 --data $data --impls "ours,$skip,liger,eager" --breakdown --reps 10
    loss --n 16384 --v 248320 --data $data --impls "ours,$skip,liger" --reps 6
    loss --n 8192 --v 151936 --data $data --temperature 1 --kl-weight 1 --impls "ours,$skip,speculators" --reps 10
    loss --n 8192 --v 151936 --data $data --kl-weight 0 --impls "ours,$skip,cce" --reps 10
  done
  tests tests/kernels/test_distill_loss_skip.py tests/kernels/test_distill_loss.py \
    tests/kernels/test_distill_loss_cuda.py -k "skip or bf16_matches or peak_memory or triton_matches"
}

# drafter-spread: the drafter step's spread between processes and within them (3 repeats each), with and
#   without --prefetch, at the Qwen3-8B and Qwen3.6-27B drafter shapes, after the cuBLAS GEMM rate at the
#   loss's chunk shapes.
call_drafter_spread() {
  PYTHONPATH=$(tree after) python3 tests/benchmarks/gemm_ceiling.py 2>&1 | tee -a "$log"
  note "${PIPESTATUS[0]}"
  local timed=(--steps 10 --warmup 3 --repeats 3)
  drafter after "${D8[@]}" "${timed[@]}"
  drafter after "${D8[@]}" "${timed[@]}"
  drafter after "${D8[@]}" "${timed[@]}" --prefetch
  drafter after "${D8[@]}" "${timed[@]}" --prefetch
  drafter after "${D27[@]}" "${timed[@]}"
  drafter after "${D27[@]}" "${timed[@]}" --prefetch
}

# drafter-ab: a drafter change judged by GPU kernel time (--profile 2): bench_drafter alternating the trees of
#   CODES (default "before after") for ROUNDS rounds at the Qwen3-8B shape (default 2), then one round at the
#   Qwen3.6-27B drafter shape unless NO_27B is set; TESTS (CUDA tests) first; EXTRA added to every
#   bench_drafter.
call_drafter_ab() {
  local code _ timed=(--warmup 3 --prefetch --profile 2 ${EXTRA:-})
  [ -n "${TESTS:-}" ] && tests $TESTS
  for _ in $(seq "${ROUNDS:-2}"); do
    for code in $(codes "before after"); do drafter "$code" "${D8[@]}" --steps 8 "${timed[@]}"; done
  done
  [ -n "${NO_27B:-}" ] && return
  for code in $(codes "before after"); do drafter "$code" "${D27[@]}" --steps 6 "${timed[@]}"; done
}
pre_drafter_ab() { need_trees "before after"; }

# drafter-bf16: the drafter step with activations in bf16 between layers against build/before, and with
#   --teacher-fp8, at the Qwen3-8B and the Qwen3.6-27B drafter shapes (3 repeats of 10 steps a process), after
#   the CUDA tests of those paths.
call_drafter_bf16() {
  local code _ timed=(--steps 10 --warmup 3 --repeats 3 --prefetch)
  tests tests/unit/test_trainer_attention_cuda.py tests/unit/test_trainer_attention.py \
    tests/kernels/test_trainer_route.py tests/kernels/test_teacher_fp8.py tests/unit/test_trainer_loss.py
  for _ in 1 2; do for code in before after; do drafter $code "${D8[@]}" "${timed[@]}"; done; done
  drafter after "${D8[@]}" "${timed[@]}" --teacher-fp8
  for code in before after; do drafter $code "${D27[@]}" "${timed[@]}"; done
  drafter after "${D27[@]}" "${timed[@]}" --teacher-fp8
}
pre_drafter_bf16() { CODES="before after" need_trees "before after"; }

# drafter27: the incident's drafter shape (Qwen3.6-27B: hidden 5120, V 248,320, sliding window), one process
#   per tree of CODES (default "head after") with a kernel-time profile; MORE_ANCHORS: anchor counts at which
#   the first tree runs again; PLAIN=1: the plain PyTorch step (dense mask, torch loss, ops one by one,
#   foreach AdamW) of the first tree; GEMM=1: the cuBLAS rate at the loss's chunk shapes first; TESTS (CUDA
#   tests, TESTS_S seconds) first; ANCHORS (512), STEPS (6), REPEATS (2), PROFILE (2), EXTRA (added to every
#   run), BENCH_S (150 s a process).
call_drafter27() {
  local BENCH_S=${BENCH_S:-150} TESTS_S=${TESTS_S:-150} code n first
  [ -n "${TESTS:-}" ] && tests $TESTS
  if [ -n "${GEMM:-}" ]; then
    PYTHONPATH=$(tree after) timeout 60 python3 tests/benchmarks/gemm_ceiling.py --d 5120 --v 248320 2>&1 \
      | tail -12 | tee -a "$log"
    note "${PIPESTATUS[0]}"
  fi
  local shape=(--shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2)
  local timed=(--attn-impl flex --steps "${STEPS:-6}" --warmup 3 --repeats "${REPEATS:-2}" --prefetch ${EXTRA:-})
  first=$(codes "head after"); first=${first%% *}
  for code in $(codes "head after"); do
    drafter "$code" "${shape[@]}" --anchors "${ANCHORS:-512}" "${timed[@]}" --profile "${PROFILE:-2}"
  done
  for n in ${MORE_ANCHORS:-}; do drafter "$first" "${shape[@]}" --anchors "$n" "${timed[@]}"; done
  [ -n "${PLAIN:-}" ] && drafter "$first" "${shape[@]}" --anchors "${ANCHORS:-512}" --attn-impl dense \
    --loss-impl torch --eager-elementwise --fused-adamw off --steps 3 --warmup 1 --no-launch-ahead
  return 0
}
pre_drafter27() { need_trees "head after"; }

# drafter-kinds: DFlash against DFlash 2 (--drafter-kind dflash2: the convolutions around each sublayer, the
#   selector and its loss) at the incident's drafter shape, alternating the two kinds for ROUNDS rounds
#   (default 2), one process each with a kernel-time profile; TESTS (CUDA tests) first; ANCHORS (512), STEPS
#   (6), BENCH_S (150 s a process), EXTRA (added to every run).
call_drafter_kinds() {
  local BENCH_S=${BENCH_S:-150} kind
  [ -n "${TESTS:-}" ] && tests $TESTS
  for _ in $(seq "${ROUNDS:-2}"); do
    for kind in dflash dflash2; do
      drafter after --shape qwen3.6-27b --vocab 248320 --seq-len 8192 --seqs 2 --anchors "${ANCHORS:-512}" \
        --attn-impl flex --steps "${STEPS:-6}" --warmup 3 --prefetch --profile 2 --drafter-kind "$kind" ${EXTRA:-}
    done
  done
  return 0
}

# conv: DFlash 2's grouped convolution kernels at the Qwen3.6-27B drafter shape, forward and backward apart, at
#   several tiles and warp counts against the torch version compiled (bench_grouped_conv); TESTS (CUDA tests) first.
call_conv() {
  [ -n "${TESTS:-}" ] && tests $TESTS
  say "== bench_grouped_conv ($(date -u +%T))"
  PYTHONPATH=$(tree after) python3 -m tests.benchmarks.bench_grouped_conv 2>>"$err" | tee -a "$full" | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

# codebook-grad: the selector codebooks' gather, forward + backward, by indexing, F.embedding and index_add_, at
#   the Qwen3.6-27B drafter's rows, Zipf-distributed ids and uniform ones (bench_codebook_grad).
call_codebook_grad() {
  local z
  for z in 1.1 0; do
    say "== bench_codebook_grad --zipf $z ($(date -u +%T))"
    PYTHONPATH=$(tree after) python3 -m tests.benchmarks.bench_codebook_grad --zipf "$z" 2>>"$err" | tee -a "$full" \
      | tee -a "$log"
    note "${PIPESTATUS[0]}"
  done
}

# drafter-profile: where the drafter step's GPU time goes (bench_drafter --profile 2: kernels by kind, the
#   GPU's idle gaps, the small kernels by the host ops that launched them) at the Qwen3-8B and the Qwen3.6-27B
#   drafter shapes, then flex attention's kernel options against max-autotune's (bench_flex.py).
call_drafter_profile() {
  drafter after "${D8[@]}" --steps 6 --warmup 3 --prefetch --profile 2
  drafter after --shape qwen3.6-27b --vocab 248320 --seq-len 8192 --attn-impl flex --steps 6 --warmup 3 --prefetch \
    --profile 2
  say "== bench_flex ($(date -u +%T))"
  PYTHONPATH=$(tree after) python3 tests/benchmarks/bench_flex.py --shape qwen3-8b --autotune 2>>"$err" | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

# prep-ab: the trainer's step (Trainer.train_step, target and drafter in one process) alternating the trees of
#   CODES (default "prep-before after"), 3 processes each, the last "after" one with --sync-check, after the
#   CUDA attention tests; the Qwen3-8B target at 8 layers, 8,192 tokens a micro-batch. KERNELS: another
#   kernels/ for every tree.
call_prep_ab() {
  local q=$SCRATCH/q3 run code extra
  shapes "$q" --shape qwen3-8b --layers 8 --seqs 48 --seq-len 4096 || return 1
  tests tests/unit/test_trainer_attention_cuda.py
  for run in 1 2 3; do
    for code in $(codes "prep-before after"); do
      extra=(); [ "$code" = after ] && [ $run = 3 ] && extra=(--sync-check)
      prep "$code" "$SCRATCH/$code$run" "${extra[@]}" -- --target-model "$q/model" --data-dir "$q/data" "${TRAIN[@]}" \
        --token-budget 8192 --max-seq-len 4096 --max-anchors 512 --max-steps 14
    done
  done
}
pre_prep_ab() { need_trees "prep-before after"; }

# tau-fp8: tau with and without the FP8 teacher on the real-text tiny target (ASSETS: a
#   `platform/tiny-assets.sh 0 text` output carried along), four seeds, 8 runs at a time on the GPU.
call_tau_fp8() {
  PYTHONPATH=$(tree after) python3 tests/benchmarks/bench_tau_settings.py --device cuda --assets "$ASSETS" \
    --seeds 0,1,2,3 --jobs 8 --threads-per-job 2 --settings kl-T2-w0.7-streak,kl-T2-w0.7-streak-fp8 --out "$SCRATCH/tau" \
    --json "$OUT/tau.json" 2>&1 | tee -a "$log"
  note "${PIPESTATUS[0]}"
}
pre_tau_fp8() {
  [ -d "${ASSETS:-}" ] || echo "tau-fp8 needs ASSETS=DIR, the real-text tiny target (platform/tiny-assets.sh 0 text prints it)"
}

# e2e-compile: the whole trainer step at the incident's density with the full-depth Qwen3-8B target compiled
#   (--target-compile auto, the default) and eager (off), alternating, two rounds, within 440 s.
call_e2e_compile() {
  local q=$SCRATCH/q8 run c
  shapes "$q" --shape qwen3-8b --seqs 256 --seq-len 4096 || return 1
  for run in 1 2; do
    for c in off auto; do
      out_of_time 440 "--target-compile $c run $run" && continue
      prep after "$SCRATCH/$c$run" -- --target-model "$q/model" --data-dir "$q/data" "${TRAIN[@]}" \
        --token-budget 65536 --max-seq-len 4096 --max-anchors 512 --max-steps 10 --target-compile $c
    done
  done
}

# e2e-anchors: the whole trainer step with the Qwen3-8B target (layers compiled) as the anchors per
#   micro-batch grow: --max-anchors 512, 1024, 2048 at 65,536 tokens, one process each, within 500 s.
call_e2e_anchors() {
  local q=$SCRATCH/q8 anchors
  shapes "$q" --shape qwen3-8b --seqs 256 --seq-len 4096 || return 1
  for anchors in 512 1024 2048; do
    out_of_time 500 "--max-anchors $anchors" && continue
    prep after "$SCRATCH/a$anchors" -- --target-model "$q/model" --data-dir "$q/data" "${TRAIN[@]}" \
      --token-budget 65536 --max-seq-len 4096 --max-anchors $anchors --max-steps 8
  done
}

# e2e-27b: the whole trainer step with the incident's target (the Qwen3.6-27B shape written as the real
#   wrapped checkpoint, 51 GiB, loaded through the trainer's path) and its drafter: one process per
#   --max-anchors in ANCHORS (default 512) of STEPS steps (8), each started only within BUDGET_S seconds
#   (400); the checkpoint is removed at the end.
call_e2e_27b() {
  local q=$SCRATCH/q27 anchors free_gib
  mkdir -p "$SCRATCH"
  free_gib=$(df -BG --output=avail "$SCRATCH" | tail -1 | tr -dc 0-9)
  [ "${free_gib:-0}" -gt 70 ] || q=${TMPDIR:-/tmp}/ff/q27
  say "checkpoint under $q ($SCRATCH: ${free_gib} GiB free)"
  shapes "$q" --shape qwen3.6-27b --seqs 96 --seq-len 8192 || return 1
  du -sh "$q/model" | tee -a "$log"
  for anchors in ${ANCHORS:-512}; do
    out_of_time "${BUDGET_S:-400}" "--max-anchors $anchors" && continue
    prep after "$SCRATCH/run$anchors" -- --target-model "$q/model" --data-dir "$q/data" "${TRAIN[@]}" \
      --token-budget 65536 --max-seq-len 8192 --max-anchors "$anchors" --max-steps "${STEPS:-8}"
  done
  rm -rf "$q"  # 51 GiB, in memory when under /dev/shm
}

# target: the target's forward at the Qwen3-8B (8 x 8,192) and Qwen3.6-27B (1 x 8,192) shapes as a soft-label
#   run asks for it and as a CE-only run does, and micro-batches of varied lengths in length groups against
#   one forward padded to the longest; then the CUDA tests.
call_target() {
  target "${T8[@]}"
  target "${T8[@]}" --no-soft-labels
  target "${T8[@]}"
  target --shape qwen3.6-27b --seqs 1 --seq-len 8192
  target --shape qwen3.6-27b --seqs 1 --seq-len 8192 --no-soft-labels
  target --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512 --padded
  target --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512
  target --shape qwen3.6-27b --seqs 4 --seq-len 8192 --min-len 512 --padded --steps 3
  target --shape qwen3.6-27b --seqs 4 --seq-len 8192 --min-len 512 --steps 3
  tests tests/unit tests/kernels -m cuda
}

# target-compile: the target's decoder layers compiled against the eager forward on varied lengths at the
#   Qwen3-8B shape (recompilations counted), after the compile test; WITH_27B=1 adds the Qwen3.6-27B shape
#   (one 8,192-token sequence).
call_target_compile() {
  local c
  tests tests/unit/test_target_compile.py
  for c in none layers; do
    compiled --shape qwen3-8b --seqs 16 --seq-len 8192 --min-len 512 --warmup 2 --steps 5 --compile $c
  done
  [ -n "${WITH_27B:-}" ] || return 0
  for c in none layers; do compiled --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 4 --compile $c; done
}
compiled() {  # compiled ARGS...: one bench_target process, its recompilations counted
  say "== bench_target $* ($(date -u +%T))"
  PYTHONPATH=$(tree after) TORCH_LOGS=recompiles python3 -m tests.benchmarks.bench_target "$@" 2>"$err.last" \
    | grep -E '^\{|^built' | tee -a "$log"
  note "${PIPESTATUS[0]}"
  say "recompilations: $(grep -c 'Recompiling function' "$err.last")"
  grep -E 'Error|error' "$err.last" | tail -3 | tee -a "$log"
  cat "$err.last" >>"$err"
}

# target-fuse: the Qwen3-8B target's forward (8 x 8,192) eager, with cuDNN attention first, with norms and
#   MLPs compiled, with each layer compiled, and both; eager first and last as the anchor.
call_target_fuse() {
  local setting
  for setting in "--compile none" "--sdpa cudnn" "--compile parts" "--compile layers" "--compile layers --sdpa cudnn" \
                 "--compile none"; do
    # shellcheck disable=SC2086  # $setting is several arguments
    target "${T8[@]}" --warmup 2 --steps 5 $setting
  done
}

# target-profile: where the target's forward spends its GPU time (--profile 1, kernel time by kind) at the
#   Qwen3-8B shape and the Qwen3.6-27B shape, layers compiled; SHORT_CONV=torch: the 27B's short convolution
#   in transformers' torch path (default fla).
call_target_profile() {
  target "${T8[@]}" --warmup 2 --steps 3 --compile layers --profile 1
  target --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 3 --compile layers --profile 1 \
    --short-conv "${SHORT_CONV:-fla}"
}

# target-autotune: the Qwen3-8B target's compiled layers under inductor's max-autotune against the default
#   compile, alternating, the autotuned one profiled; TESTS (CUDA tests) first.
call_target_autotune() {
  [ -n "${TESTS:-}" ] && tests $TESTS
  target "${T8[@]}" --warmup 2 --steps 5 --compile layers
  target "${T8[@]}" --warmup 2 --steps 5 --compile layers --compile-mode max-autotune-no-cudagraphs --profile 1
  grep -E 'AUTOTUNE|SingleProcess|mm_' "$err" | sort | uniq -c | sort -rn | head -30 | tee -a "$log"
  target "${T8[@]}" --warmup 2 --steps 5 --compile layers
  target "${T8[@]}" --warmup 2 --steps 5 --compile layers --compile-mode max-autotune-no-cudagraphs
}

# target-short-conv: the hybrid target's short convolution through flash-linear-attention's kernel against
#   transformers' torch path (Qwen3.6-27B, layers compiled, alternating), varied lengths profiled, after the
#   attention backends at the Qwen3-8B shape and the CUDA tests of those paths.
call_target_short_conv() {
  local conv
  PYTHONPATH=$(tree after) python3 tests/benchmarks/attn_backends.py --seqs 8 --seq-len 8192 2>>"$err" | tee -a "$log"
  note "${PIPESTATUS[0]}"
  tests tests/unit/test_short_conv.py tests/unit/test_target_compile.py
  for conv in fla torch fla; do
    target --shape qwen3.6-27b --seqs 1 --seq-len 8192 --warmup 2 --steps 4 --compile layers --short-conv $conv
  done
  target --shape qwen3.6-27b --seqs 4 --seq-len 8192 --min-len 512 --warmup 2 --steps 3 --compile layers --profile 1
}

# eval-cache: dflash-eval's draft-verify cycle with and without the KV cache, a Qwen3-8B-wide target cut to 12
#   layers (bf16), contexts of 512, 2,048 and 8,192 tokens.
call_eval_cache() {
  PYTHONPATH=$(tree after):. python3 -m tests.benchmarks.bench_eval_cache --device cuda --hidden 4096 --layers 12 \
    --heads 32 --vocab 151936 --contexts 512,2048,8192 --new-tokens 32 --runs 3 2>>"$err" | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

# eval-hybrid-cache: a hybrid target's cached cycle (Gated-DeltaNet state kept at the committed position)
#   against the uncached one, the Qwen3.6-27B shape cut to 16 layers, contexts of 512, 2,048 and 8,192 tokens.
call_eval_hybrid_cache() {
  PYTHONPATH=$(tree after) timeout 300 python3 -m tests.benchmarks.bench_eval_hybrid_cache --shape qwen3.6-27b \
    --layers 16 --contexts 512,2048,8192 --cycles 6 --device cuda 2>>"$err" | tee -a "$log"
  note "${PIPESTATUS[0]}"
}

# ---- the set-up, once ----------------------------------------------------------------------------

need_trees() {  # need_trees DEFAULT: each tree of CODES (else DEFAULT) other than "after" is in build/
  local code
  for code in ${CODES:-$1}; do
    [ "$code" = after ] || [ -d "build/$code/trainer/flashfleet_trainer" ] \
      || echo "no build/$code/trainer/flashfleet_trainer: make it with git archive COMMIT trainer/flashfleet_trainer" \
              "| tar -x -C build/$code (or name other trees in CODES)"
  done
}

calls() { declare -F | sed -n 's/^declare -f call_//p' | tr _ -; }

if [ "${1:-}" = list ]; then  # each call's comment, joined into one line
  awk -v calls=" $(calls | xargs) " '/^# [a-z0-9-]+: / { n = substr($2, 1, length($2) - 1)
    if (index(calls, " " n " ")) { line = substr($0, 3)
      while ((getline l) > 0 && l ~ /^#   /) line = line " " substr(l, 5)
      print line } }' "$0"
  exit 0
fi
refuse() { echo "gpu.sh$1" >&2; exit 78; }  # bad input: one line, nothing run or written
[ $# -gt 0 ] || refuse ": name a call (OUT=/tmp/out bash tests/benchmarks/gpu.sh NAME...; the calls: $(calls | xargs))"
[ -n "${OUT:-}" ] || refuse ": set OUT to a folder for the results (OUT=/tmp/out bash tests/benchmarks/gpu.sh $*)"
for name in "$@"; do  # every call known and its inputs there before anything runs
  fn=${name//-/_}
  [[ $name != *_* ]] && declare -F "call_$fn" >/dev/null || refuse ": no call '$name' (the calls: $(calls | xargs))"
  if declare -F "pre_$fn" >/dev/null; then
    problem=$("pre_$fn")
    [ -z "$problem" ] || refuse " $name: $(head -1 <<<"$problem")"
  fi
done

mkdir -p "$OUT" "$SCRATCH"
log=$OUT/gpu.txt
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "tree $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'); calls: $*"
} 2>&1 | tee -a "$log"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu --format=csv,noheader -lms 500 \
  >>"$OUT/clocks.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
if compgen -G '.whl/*.whl' >/dev/null; then  # none: the machine's own transformers (the Qwen3 shapes need no more)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || exit 1
fi

status=0
for name in "$@"; do
  log=$OUT/$name.txt full=$OUT/$name.full.txt err=$OUT/$name.err.txt start=$SECONDS
  say "== $name ($(date -u +%T))"
  failed=0
  "call_${name//-/_}" || failed=1
  [ $failed = 0 ] || { status=1; say "== $name failed (a program's exit above)"; }
  say "== $name done in $((SECONDS - start)) s"
done
exit $status
