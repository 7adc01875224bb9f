#!/usr/bin/env bash
# The tiny targets and data, made once per content and cached like the node image: the cache
# folder is named by a hash of what decides the assets (the recipe, the locked versions that run
# it, the seed; for `text` also the hashes of the standard-library files it is trained on), so a
# change to any of them makes new ones and an unchanged recipe never rebuilds. Prints the folder;
# says on stderr whether it was built.
#   platform/tiny-assets.sh [SEED] [KIND]
#     KIND phrase (default): dflash-tiny, the phrase-language target of the demo and the fast tests
#          text: dflash-tiny-text, a target trained on Python standard-library source (minutes)
#          hybrid: dflash-tiny --arch qwen3_5, the phrase language on the Qwen3.5/3.6 hybrid layout
#          text-hybrid: dflash-tiny-text --arch qwen3_5, the real-text target on the hybrid layout
#   DFLASH_TINY / DFLASH_TINY_TEXT: the program to run (default: the .venv's)
#   PYTHON: the interpreter that runs tinytext (default: the .venv's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seed=${1:-0}
kind=${2:-phrase}
py=${PYTHON:-$root/.venv/bin/python}  # the interpreter whose stdlib is read (text)
case "$kind" in
  phrase)
    make=("${DFLASH_TINY:-$root/.venv/bin/dflash-tiny}")
    recipe=("$root/trainer/flashfleet_trainer/tiny.py")
    sources=""
    prefix=tiny ;;
  hybrid)
    make=("${DFLASH_TINY:-$root/.venv/bin/dflash-tiny}" --arch qwen3_5)
    recipe=("$root/trainer/flashfleet_trainer/tiny.py")
    sources=""
    prefix=tiny-hybrid ;;
  text|text-hybrid)
    if [ -n "${DFLASH_TINY_TEXT:-}" ]; then make=("$DFLASH_TINY_TEXT"); else make=("$py" -m flashfleet_trainer.tinytext); fi
    recipe=("$root/trainer/flashfleet_trainer/tiny.py" "$root/trainer/flashfleet_trainer/tinytext.py")
    sources=$("${make[@]}" --list-sources)
    prefix=tiny-$kind
    [ "$kind" = text ] || make+=(--arch qwen3_5) ;;
  *)
    echo "tiny assets: unknown kind '$kind' (fix: pass phrase, hybrid, text or text-hybrid)" >&2
    exit 2 ;;
esac
key=$( { cat "${recipe[@]}" "$root/requirements/controller.lock"; echo "seed=$seed"; [ -z "$sources" ] || echo "$sources"; } \
       | sha256sum | cut -c1-16)
out="$root/.cache/$prefix-$key"
if [ -f "$out/tiny.json" ]; then
  echo "tiny assets: $out is up to date" >&2
else
  mkdir -p "$root/.cache"
  tmp="$out.tmp-$$"
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
  "${make[@]}" --seed "$seed" "$tmp" >&2
  mv -T "$tmp" "$out" 2>/dev/null || echo "tiny assets: $out was made meanwhile; keeping that one" >&2
  echo "tiny assets: built $out in $(( $(date +%s) - start )) s" >&2
fi
echo "$out"
