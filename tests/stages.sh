#!/usr/bin/env bash
# `make test` / `make test-full`: every stage of the tier, stopping at the first failure, and a
# summary of where the time went printed at the end either way (docs/benchmarks.md records one).
#   Two tiers (TEST_TIER): "gate" (`make test`, what CI runs on every change: within 30 minutes on
#   a quiet 2-core machine) and "full" (`make test-full`, nightly and before a release: the gate
#   plus the kernel, driver, vllm and cluster scenarios). Why those four are not in the gate: on a
#   2-core machine the whole suite is about 44 minutes of CPU-bound work, so part of it has to run
#   less often; these are the ones whose code changes least (the kernel and nvidia_driver roles)
#   or whose behaviour the gate proves another way: pytest's real vLLM servers feed the real
#   trainer (tests/unit/test_vllm_target.py) and the server units are rendered by the roles
#   (tests/playbooks/test_vllm_server_units.py); multi-node rendezvous, a killed node named first
#   and a restarted node refused run as processes (tests/unit/test_trainer_scale.py) and the verbs'
#   plays on a run's several hosts locally (tests/playbooks/test_run_hosts.py). docs/benchmarks.md,
#   "The test suite's time", has the figures behind the split.
#   Two lanes side by side, each its stages in order:
#     lane 1: lint (the quickest to fail), pytest; in the full tier then the vllm scenario (the
#             suite's own vLLM servers are gone by then, so two engines never share RAM) and cluster
#     lane 2: the other Molecule scenarios; in the full tier kernel and driver first (kernel leaves
#             the built kernel's .debs in .cache/kernel-debs, which the driver scenario builds its
#             module against)
#   Why lanes: pytest runs one torch thread, and a scenario waits for much of its time (restart
#   delays, stops, polls); side by side, one lane's waits are filled with the other's work
#   (docs/benchmarks.md has the figures). The lanes hold about the same work; every scenario still
#   runs whole, each in its own containers.
# Stop at the first failure: the failing lane stops there and the other lane is stopped at once
# (its running stage is reported "stopped"; the next run of that scenario begins with its destroy
# step, which removes any node containers left). Lane 2 prints live; lane 1's output is printed
# whole when each of its stages ends. The summary ends with a failed stage's failure lines
# (tests/failure_lines.py), so the reason is in the output's last lines, not only in its middle.
# TEST_LANES=1 runs every stage one after another, lane 1's then lane 2's; TEST_LIST=1 prints them.
set -uo pipefail
cd "$(dirname "$0")/.."

TIER=${TEST_TIER:-gate}
GATE1=(lint pytest)
GATE2=("molecule faults" "molecule launch" "molecule cuda" "molecule lxc" "molecule staging")
FULL1=("molecule vllm" "molecule cluster")   # in lane 1 after pytest
FULL2=("molecule kernel" "molecule driver")  # in lane 2 before the gate's scenarios
case "$TIER" in
  gate) LANE1=("${GATE1[@]}"); LANE2=("${GATE2[@]}") ;;
  full) LANE1=("${GATE1[@]}" "${FULL1[@]}"); LANE2=("${FULL2[@]}" "${GATE2[@]}") ;;
  *) echo "make test: unknown TEST_TIER '$TIER' (fix: gate or full)" >&2; exit 2 ;;
esac

# Every scenario directory must be in exactly one stage list: a new scenario fails here, never skipped.
check_lanes() {
  local dir scenario
  for dir in molecule/*/molecule.yml; do
    scenario=$(basename "$(dirname "$dir")")
    if [ "$(printf '%s\n' "${GATE1[@]}" "${GATE2[@]}" "${FULL1[@]}" "${FULL2[@]}" | grep -cx "molecule $scenario")" -ne 1 ]; then
      echo "make test: scenario '$scenario' is in no stage list (or two); fix: add it to GATE1/GATE2 (every run) or FULL1/FULL2 (make test-full) in tests/stages.sh" >&2
      exit 2
    fi
  done
}

check_lanes
if [ -n "${TEST_LIST:-}" ]; then  # TEST_LIST=1: print the tier's stages, one lane a line, and run nothing
  (IFS=,; echo "lane 1: ${LANE1[*]}"; echo "lane 2: ${LANE2[*]}")
  exit 0
fi

run_stage() {  # run_stage NAME: the stage's command
  case "$1" in
    lint) yamllint -s . && ruff check . && ansible-lint --profile production ;;
    # Shuffled (tests/conftest.py): no test may depend on another's having run first.
    pytest) pytest -q --shuffle-seed "${PYTEST_SHUFFLE_SEED:-51}" ;;
    # profile_tasks: each playbook run ends with its slowest tasks (Molecule's own ansible.cfg
    # replaces the project's, which enables it). NO_COLOR: plain lines, as CI gets them; in colour
    # Molecule frames its output and wraps long lines, splitting a failed task's result.
    "molecule "*) NO_COLOR=1 ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks molecule test -s "${1#molecule }" ;;
    *) echo "make test: unknown stage '$1'" >&2; return 2 ;;
  esac
}

cpu_ticks() {  # busy and total jiffies of all cores since boot (/proc/stat's first line)
  awk '/^cpu /{busy = $2 + $3 + $4 + $7 + $8; total = busy + $5 + $6; print busy, total; exit}' /proc/stat
}
read -r BUSY0 TOTAL0 < <(cpu_ticks)  # the summary's CPU share: would more lanes help? (not if ~100%)
RECORDS=$(mktemp -d)  # per lane: its finished stages ("name<TAB>seconds<TAB>result"), its running one,
                      # its current stage's output (ID.log), its failed stage's name (ID.failed)
trap 'summary; rm -rf "$RECORDS"' EXIT

stage() {  # stage LANE LIVE NAME: runs it, its output into the lane's log (LIVE: printed as it comes,
           # else printed whole when it ends), and records it; a failure keeps its log for the summary
  local lane=$1 live=$2 name=$3 log=$RECORDS/$1.log t0=$SECONDS rc
  echo "=== $name (lane $lane, started $(date -u +%H:%M:%S))"
  printf '%s\t%d\n' "$name" "$t0" >"$RECORDS/$lane.running"
  if [ "$live" = live ]; then
    run_stage "$name" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    run_stage "$name" >"$log" 2>&1
    rc=$?
    echo "=== $name: its output"
    cat "$log"
  fi
  rm -f "$RECORDS/$lane.running"
  printf '%s\t%d\t%s\n' "$name" $((SECONDS - t0)) "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)")" \
    >>"$RECORDS/$lane"
  [ "$rc" -eq 0 ] || printf '%s\n' "$name" >"$RECORDS/$lane.failed"
  return "$rc"
}

lane() {  # lane ID live|quiet STAGES...: the stages in order, stopping at the first failure
  local id=$1 live=$2 name
  shift 2
  for name in "$@"; do
    stage "$id" "$live" "$name" || exit  # with the stage's exit status
  done
}

stop_lane() {  # stop_lane ID PID: stop a lane's whole process group; record its running stage as stopped
  local id=$1 pid=$2 name t0
  kill -TERM -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [ -f "$RECORDS/$id.running" ]; then
    IFS=$'\t' read -r name t0 <"$RECORDS/$id.running"
    printf '%s\t%d\t%s\n' "$name" $((SECONDS - t0)) "stopped: the other lane failed" >>"$RECORDS/$id"
    echo "=== $name: stopped (the other lane failed)"
    if [ "$id" = 1 ]; then echo "=== $name: its output so far (last 200 lines)"; tail -n 200 "$RECORDS/1.log"; fi
  fi
}

summary() {
  local failed
  for failed in "$RECORDS"/*.failed; do  # why it failed, here at the end where CI's excerpt shows it
    [ -f "$failed" ] || continue
    echo
    echo "make test: why '$(cat "$failed")' failed (its failure lines; its whole output is above)"
    python3 tests/failure_lines.py "${failed%.failed}.log" | sed 's/^/  /'
  done
  echo
  echo "make test: time per stage (tier $TIER)"
  local id name secs result total=0
  for id in 1 2 serial; do
    [ -f "$RECORDS/$id" ] || continue
    [ "$id" = serial ] || echo "  lane $id:"
    while IFS=$'\t' read -r name secs result; do
      printf '  %-22s %6d s  %s\n' "$name" "$secs" "$result"
      total=$((total + secs))
    done <"$RECORDS/$id"
  done
  printf '  %-22s %6d s\n' "sum of stages" "$total"
  printf '  %-22s %6d s  (the lanes side by side)\n' "wall" "$SECONDS"
  local busy total
  read -r busy total < <(cpu_ticks)
  [ "$total" -gt "$TOTAL0" ] && printf '  %-22s %6d %%  (of all cores, the whole machine)\n' "CPU busy" \
    $(( 100 * (busy - BUSY0) / (total - TOTAL0) ))
}

if [ "${TEST_LANES:-2}" = 1 ]; then
  lane serial live "${LANE1[@]}" "${LANE2[@]}"
  exit
fi

# Each lane in its own process group (job control), so stopping a lane stops its Molecule, Ansible
# and pytest children too.
set -m
lane 1 quiet "${LANE1[@]}" &
pid1=$!
lane 2 live "${LANE2[@]}" &
pid2=$!
set +m

# Look every few seconds which lane has ended; the first failure stops the other lane.
rc=0
running=("1:$pid1" "2:$pid2")
while [ "${#running[@]}" -gt 0 ]; do
  sleep 2
  still=()
  for entry in "${running[@]}"; do
    if kill -0 "${entry#*:}" 2>/dev/null; then still+=("$entry"); continue; fi
    wait "${entry#*:}"
    rc=$?
    if [ "$rc" -ne 0 ]; then
      for other in "${running[@]}"; do
        [ "$other" = "$entry" ] || stop_lane "${other%%:*}" "${other#*:}"
      done
      exit "$rc"
    fi
  done
  running=("${still[@]}")
done
exit 0
