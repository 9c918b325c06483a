#!/usr/bin/env bash
# libkeel's exported ABI against the committed baseline of its libtorch
# release (abi/libkeel-torch-<release>.abi.xz: abidw's XML of the library's
# DWARF, types of the public headers only; xz keeps it small in git).
#
#   scripts/abi-check.sh BUILD_DIR            compare; exit 1 on an incompatible change
#   scripts/abi-check.sh BUILD_DIR --update   write a new baseline, deliberately
#
# An incompatible change (a removed or changed symbol, a changed layout of a
# type the API passes) fails until the baseline is updated, and --update
# refuses unless include/keel/version.h has moved past the version the old
# baseline was taken at and CHANGELOG.md has a "## <new version>" section:
# the ABI changes only together with a version bump and a changelog line.
# Additions (new functions) are compatible: reported, not failed.
set -euo pipefail
build=${1:?usage: scripts/abi-check.sh BUILD_DIR [--update]}
mode=${2:-check}
cd "$(dirname "$0")/.."
build=$(cd "$build" && pwd)

version=$(sed -n 's/^#define KEEL_VERSION_STRING "\(.*\)"$/\1/p' include/keel/version.h)
torch=$("$build/keel-info" --json | sed -n 's/.*"torch_version": *"\([^"]*\)".*/\1/p')
lib=$(readlink -f "$build/libkeel.so")
baseline=abi/libkeel-torch-$torch.abi.xz
stamp=abi/libkeel-torch-$torch.version
[ -f "$lib" ] || { echo "keel abi: no libkeel.so in $build" >&2; exit 1; }
has_changelog() { grep -q "^## $1\b" CHANGELOG.md; }

if [ "$mode" = --update ]; then
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
    echo "keel abi: the baseline was taken at keel $version; bump KEEL_VERSION_* in" \
      "include/keel/version.h before replacing it" >&2
    exit 1
  fi
  has_changelog "$version" || {
    echo "keel abi: CHANGELOG.md has no \"## $version\" section saying what changed" >&2
    exit 1
  }
  abidw --headers-dir include/keel --drop-private-types --no-show-locs --no-corpus-path "$lib" |
    xz -9 > "$baseline"
  echo "$version" > "$stamp"
  echo "keel abi: new baseline $baseline for keel $version on libtorch $torch"
  exit 0
fi

[ -f "$baseline" ] || {
  echo "keel abi: no baseline for libtorch $torch ($baseline); only the committed releases are checked"
  exit 0
}
recorded=$(cat "$stamp")
has_changelog "$recorded" || {
  echo "keel abi: the baseline was taken at keel $recorded, which CHANGELOG.md does not list" >&2
  exit 1
}
xml=$(mktemp --suffix=.abi)
trap 'rm -f "$xml"' EXIT
xz -dc "$baseline" > "$xml"
status=0
report=$(abidiff --headers-dir2 include/keel --drop-private-types --no-show-locs "$xml" "$lib") || status=$?
# abidiff's status is a bit set: 1 error, 2 usage, 4 ABI change, 8 incompatible change.
if (( status & 3 )); then
  echo "$report"
  echo "keel abi: abidiff failed (status $status)" >&2
  exit 1
fi
if (( status & 8 )); then
  echo "$report"
  echo "keel abi: INCOMPATIBLE change against the baseline of keel $recorded on libtorch $torch." >&2
  echo "  If it is deliberate: bump include/keel/version.h, add a CHANGELOG.md section for the" >&2
  echo "  new version, then run scripts/abi-check.sh $build --update and commit abi/." >&2
  exit 1
fi
if (( status & 4 )); then
  echo "$report"
  echo "keel abi: compatible changes only (additions) against keel $recorded on libtorch $torch"
else
  echo "keel abi: libkeel.so matches the baseline of keel $recorded on libtorch $torch"
fi
