#!/usr/bin/env bash
# The demo's tiny target and data (dflash-tiny), made once per content and cached like the node
# image: the cache folder is named by a hash of what decides the assets (the recipe, the locked
# versions that run it, the seed), so a change to any of them makes new ones and an unchanged
# recipe never rebuilds. Prints the folder; says on stderr whether it was built.
#   platform/tiny-assets.sh [SEED]        (DFLASH_TINY: the dflash-tiny to run; default .venv's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seed=${1:-0}
tiny=${DFLASH_TINY:-$root/.venv/bin/dflash-tiny}
key=$( { cat "$root/trainer/flashfleet_trainer/tiny.py" "$root/requirements/controller.lock"; echo "seed=$seed"; } \
       | sha256sum | cut -c1-16)
out="$root/.cache/tiny-$key"
if [ -f "$out/tiny.json" ]; then
  echo "tiny assets: $out is up to date" >&2
else
  mkdir -p "$root/.cache"
  tmp="$out.tmp-$$"
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
  "$tiny" --seed "$seed" "$tmp" >&2
  mv -T "$tmp" "$out" 2>/dev/null || echo "tiny assets: $out was made meanwhile; keeping that one" >&2
  echo "tiny assets: built $out in $(( $(date +%s) - start )) s" >&2
fi
echo "$out"
