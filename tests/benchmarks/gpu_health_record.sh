#!/usr/bin/env bash
# Records, on a GPU machine, exactly what the GPU health check (module_utils/flashfleet/gpu_health)
# reads, into $OUT, under the names a recorded directory uses (gather.RECORDED), then runs the check
# on that recording and live, and once with a threshold set above what the card gives (refused):
#   OUT=/tmp/rec tests/benchmarks/gpu_health_record.sh
# From the repository root; Python is $PYTHON, else .venv/bin/python, else python3 (the one with
# torch); nothing outside the machine is needed. Files in $OUT:
#   nvidia-smi-q.txt   `nvidia-smi -q`
#   kernel-log.txt     `journalctl -k -b 0 -o short-unix --no-pager` (else `dmesg`: see check.txt)
#   dcgmi-diag.txt     `dcgmi diag -r 1` where dcgmi is installed
#   probe.json         `python -m flashfleet_trainer.gpu_probe --gpus <all> --level 1 --json`
#   probe-level2.json  the same at --level 2 (1 GiB all-reduced)
#   check.txt          every command with its exit status and seconds, the check's tables
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the recording}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH=trainer:module_utils${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log=$OUT/check.txt
: >"$log"
step() {  # step NAME FILE COMMAND...: the command's stdout to FILE (or the log), exit status and time to the log
  local name=$1 file=$2 t0 rc
  shift 2
  t0=$EPOCHREALTIME
  echo "== $name: $*" >>"$log"
  if [ "$file" = - ]; then "$@" >>"$log" 2>&1; else "$@" >"$file" 2>>"$log"; fi
  rc=$?
  echo "== $name: exit $rc in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b-a}') s" >>"$log"
  return 0
}
{ date -u; uname -r; "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } >>"$log" 2>&1
step nvidia-smi "$OUT/nvidia-smi-q.txt" nvidia-smi -q
if command -v journalctl >/dev/null; then
  step kernel-log "$OUT/kernel-log.txt" journalctl -k -b 0 -o short-unix --no-pager
else
  echo "== kernel-log: no journalctl here; dmesg instead (seconds since boot)" >>"$log"
  step kernel-log "$OUT/kernel-log.txt" dmesg
fi
if command -v dcgmi >/dev/null; then
  step dcgmi "$OUT/dcgmi-diag.txt" dcgmi diag -r 1
else
  echo "== dcgmi: not installed on this machine" >>"$log"
fi
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
step probe-1 "$OUT/probe.json" "$PY" -m flashfleet_trainer.gpu_probe --gpus "$gpus" --level 1 --json
step probe-2 "$OUT/probe-level2.json" "$PY" -m flashfleet_trainer.gpu_probe --gpus "$gpus" --level 2 --json
# The check on the recording, the check live (its own commands, timed), and a refusal: a matmul
# figure expected above what the card gives.
step check-recorded - "$PY" -m flashfleet.gpu_health --from "$OUT"
step check-live - "$PY" -m flashfleet.gpu_health --level 1 --probe-python "$PY"
step check-refused - "$PY" -m flashfleet.gpu_health --from "$OUT" --set matmul_expected_tflops=2000
cat "$log"
