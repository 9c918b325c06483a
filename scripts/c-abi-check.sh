#!/usr/bin/env bash
# The C ABI's guard (include/keel/c/, docs/c-api.md): the layout of every
# KEEL_ struct of the C headers, read by clang as C11, and the dynamic
# symbols of the loader and of the plugin, against the committed baseline
# abi/c-abi.txt.
#
#   scripts/c-abi-check.sh BUILD_DIR            compare; exit 1 on an incompatible change
#   scripts/c-abi-check.sh BUILD_DIR --update   write the baseline, deliberately
#
# Compatible: a new struct, a field appended at a struct's end (the struct
# grows), a new function at the table's end. Anything else (a field moved,
# retyped, renamed or removed; an exported symbol gone or added) fails.
set -euo pipefail
build=${1:?usage: scripts/c-abi-check.sh BUILD_DIR [--update]}
mode=${2:-check}
build=$(cd "$build" && pwd)
cd "$(dirname "$0")/.."
baseline=abi/c-abi.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Every struct the headers define, so that clang lays each one out.
{
  echo '#include "keel/c/loader.h"'
  echo 'int keel_abi_sizes[] = {'
  sed -n 's/^typedef struct \(KEEL_[A-Za-z0-9_]*\) {.*/  sizeof(\1),/p' include/keel/c/keel.h include/keel/c/loader.h
  echo '};'
} > "$work/layouts.c"
clang -x c -std=c11 -fsyntax-only -Xclang -fdump-record-layouts -Iinclude -I"$build/dlpack-include" \
  "$work/layouts.c" > "$work/dump.txt"
# "struct KEEL_X <offset> <type and name>" for each top-level field, and
# "struct KEEL_X sizeof=N".
python3 - "$work/dump.txt" > "$work/current.txt" <<'PY'
import re, sys
name = None
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\d+) \| (\s*)(.*)$", line)
    s = re.match(r"\s*\| \[sizeof=(\d+)", line)
    if m and m.group(2) == "":
        t = m.group(3).replace("struct ", "")
        name = t if t.startswith("KEEL_") else None
    elif m and name and len(m.group(2)) == 2:
        print(f"struct {name} {m.group(1)} {m.group(3)}")
    elif s and name:
        print(f"struct {name} sizeof={s.group(1)}")
        name = None
PY
loader=$build/libkeel_loader.so
plugin=$(ls "$build"/libkeel-plugin-*-cpu.so | head -n1)
nm -D --defined-only "$loader" | awk '{print "symbol loader " $3}' >> "$work/current.txt"
nm -D --defined-only "$plugin" | awk '{print "symbol plugin " $3}' >> "$work/current.txt"

if [ "$mode" = --update ]; then
  { echo "# keel's C ABI baseline (scripts/c-abi-check.sh --update): struct layouts and exported symbols"
    sort "$work/current.txt"; } > "$baseline"
  echo "keel c-abi: wrote $baseline"
  exit 0
fi
status=0
while read -r line; do
  case $line in
    '#'*) continue ;;
    struct\ *sizeof=*)
      struct=${line#struct }; struct=${struct%% *}; old=${line##*sizeof=}
      new=$(sed -n "s/^struct $struct sizeof=//p" "$work/current.txt")
      if [ -z "$new" ] || [ "$new" -lt "$old" ]; then
        echo "keel c-abi: $struct shrank or went: sizeof $old -> ${new:-gone}"; status=1
      fi ;;
    *)
      if ! grep -qxF "$line" "$work/current.txt"; then
        echo "keel c-abi: changed or removed: $line"; status=1
      fi ;;
  esac
done < "$baseline"
while read -r line; do
  case $line in
    symbol\ *) grep -qxF "$line" "$baseline" || { echo "keel c-abi: a new exported symbol: $line (update the baseline deliberately)"; status=1; } ;;
    struct\ *sizeof=*) ;;
    *) grep -qxF "$line" "$baseline" || echo "keel c-abi: appended (compatible): $line" ;;
  esac
done < "$work/current.txt"
[ $status -eq 0 ] && echo "keel c-abi: layouts and symbols match $baseline"
exit $status
