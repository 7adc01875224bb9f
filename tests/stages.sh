#!/usr/bin/env bash
# `make test`: every stage CI runs, in order, stopping at the first failure, and a summary of
# where the time went printed at the end either way (docs/benchmarks.md records one).
#   lint, pytest, then each Molecule scenario: kernel first (it leaves the built kernel's .debs
#   in .cache/kernel-debs, which the driver scenario builds its module against), then the rest.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -a NAMES=() SECONDS_TAKEN=() RESULTS=()
summary() {
  echo
  echo "make test: time per stage"
  local total=0
  for i in "${!NAMES[@]}"; do
    printf '  %-22s %6d s  %s\n' "${NAMES[$i]}" "${SECONDS_TAKEN[$i]}" "${RESULTS[$i]}"
    total=$((total + SECONDS_TAKEN[i]))
  done
  printf '  %-22s %6d s\n' "total" "$total"
}
trap summary EXIT

stage() {  # stage NAME COMMAND...
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: $*"
  "$@"
  rc=$?
  NAMES+=("$name")
  SECONDS_TAKEN+=($((SECONDS - t0)))
  RESULTS+=("$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)")")
  [ "$rc" -eq 0 ] || exit "$rc"
}

stage lint bash -c 'yamllint -s . && ruff check . && ansible-lint --profile production'
stage pytest pytest -q
stage "molecule kernel" molecule test -s kernel
for dir in molecule/*/molecule.yml; do
  scenario=$(basename "$(dirname "$dir")")
  [ "$scenario" = kernel ] && continue
  stage "molecule $scenario" molecule test -s "$scenario"
done
