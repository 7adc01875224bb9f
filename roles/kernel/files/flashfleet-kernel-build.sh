#!/bin/bash
# Build Debian packages of a configured kernel, out of tree, keeping the log:
#   flashfleet-kernel-build.sh SRC OBJ CONFIG JOBS LOCALVERSION RELEASE LOG DEBDIR
# OBJ is reused between builds of the same source (an incremental build after a config change);
# bindeb-pkg writes its packages into OBJ's parent, from where they move to DEBDIR.
set -euo pipefail
src=$1 obj=$2 config=$3 jobs=$4 localversion=$5 release=$6 log=$7 debdir=$8
[ "$jobs" -gt 0 ] || jobs=$(nproc)
pkgdir=$(dirname "$obj")
mkdir -p "$obj" "$(dirname "$log")"
rm -f "$pkgdir"/*.deb "$pkgdir"/*.buildinfo "$pkgdir"/*.changes
cp "$config" "$obj/.config"
start=$(date +%s)
{
  echo "# flashfleet kernel build of $release: make -C $src O=$obj -j$jobs LOCALVERSION=$localversion bindeb-pkg"
  echo "# started $(date -u +%FT%TZ)"
} >"$log"
if ! make -C "$src" O="$obj" -j"$jobs" LOCALVERSION="$localversion" bindeb-pkg >>"$log" 2>&1; then
  echo "kernel build failed; last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
built=$(cat "$obj/include/config/kernel.release")
if [ "$built" != "$release" ]; then
  echo "the build produced kernel release $built, expected $release (see $log)" >&2
  exit 1
fi
rm -rf "$debdir"
mkdir -p "$debdir"
mv "$pkgdir"/*.deb "$debdir"/
cp "$obj/.config" "$debdir/config"
echo "# finished $(date -u +%FT%TZ) in $(( $(date +%s) - start )) s" >>"$log"
echo "build_seconds=$(( $(date +%s) - start ))"
