#!/bin/bash
# Compute a kernel configuration in a scratch output directory, leaving the source tree clean:
#   flashfleet-kernel-config.sh SRC OUT BASE [FRAGMENT...]
# BASE: running (/boot/config-$(uname -r)), file:PATH, or a make target of the kernel tree
# (defconfig, tinyconfig, allnoconfig, ...). The fragments are merged over the base with the
# kernel's own scripts/kconfig/merge_config.sh (later fragments win), then every requested value
# is checked against the result. Prints key=value lines: kernelversion, config_localversion,
# config_hash (sha256 of the merged .config).
set -euo pipefail
src=$1 out=$2 base=$3
shift 3
rm -rf "$out"
mkdir -p "$out"
case "$base" in
  running)
    cfg=/boot/config-$(uname -r)
    if [ ! -r "$cfg" ]; then
      echo "no configuration of the running kernel at $cfg" >&2
      exit 2
    fi
    cp "$cfg" "$out/.config" ;;
  file:*)
    cp "${base#file:}" "$out/.config" ;;
  *)
    make -s -C "$src" O="$out" "$base" >"$out/base.log" 2>&1 || { cat "$out/base.log" >&2; exit 2; } ;;
esac
cd "$src"
# merge_config.sh runs `make alldefconfig` with the merged input; it reports requested values that
# did not survive (a dependency missing, a typo) but does not fail on them: this script does.
scripts/kconfig/merge_config.sh -O "$out" "$out/.config" "$@" >"$out/merge.log" 2>&1 \
  || { cat "$out/merge.log" >&2; exit 2; }
# Only the fragments' values must survive; a base value the new source drops is the kernel's call.
wanted=$(sed -n -e 's/^\(CONFIG_[A-Za-z0-9_]*\)=.*/\1/p' -e 's/^# \(CONFIG_[A-Za-z0-9_]*\) is not set$/\1/p' "$@" </dev/null | sort -u)
lost=$(sed -n 's/^Value requested for \(CONFIG_[A-Za-z0-9_]*\) not in final .config$/\1/p' "$out/merge.log" | sort -u)
missing=$(comm -12 <(printf '%s\n' "$wanted") <(printf '%s\n' "$lost") | grep . || true)
if [ -n "$missing" ]; then
  echo "requested by a fragment but not in the merged configuration (a dependency is off, or the" >&2
  echo "symbol does not exist in this kernel):" >&2
  for sym in $missing; do grep -A2 "^Value requested for $sym not" "$out/merge.log" >&2; done
  exit 3
fi
echo "kernelversion=$(make -s kernelversion)"
echo "config_localversion=$(sed -n 's/^CONFIG_LOCALVERSION="\(.*\)"$/\1/p' "$out/.config")"
echo "localversion_auto=$(grep -c '^CONFIG_LOCALVERSION_AUTO=y$' "$out/.config" || true)"
echo "config_hash=$(sha256sum "$out/.config" | cut -d' ' -f1)"
