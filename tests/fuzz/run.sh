#!/usr/bin/env bash
# Runs one keel fuzz target (tests/fuzz/CMakeLists.txt).
#   run.sh replay FUZZER DIR...            every input in the DIRs once
#   run.sh fuzz FUZZER CORPUS SECONDS WORK fuzz from a scratch copy of CORPUS
# A crash, a leak or a sanitizer report fails the run; the input that caused
# it is kept under WORK/ and printed in hex (add it to regressions/NAME/).
set -euo pipefail
mode=$1 fuzzer=$2
shift 2
name=$(basename "$fuzzer")
case $mode in
  replay)
    files=()
    for d in "$@"; do
      [ -d "$d" ] || continue
      while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$d" -type f -print0)
    done
    if [ ${#files[@]} -eq 0 ]; then echo "$name: no inputs to replay"; exit 0; fi
    "$fuzzer" -rss_limit_mb=4096 "${files[@]}" > /dev/null 2>&1 || {
      # Again with the output, one input at a time, to name the failing one.
      for f in "${files[@]}"; do "$fuzzer" -rss_limit_mb=4096 "$f" || { echo "$name: FAILED on $f"; exit 1; }; done
    }
    echo "$name: ${#files[@]} inputs replayed, none failed"
    ;;
  fuzz)
    corpus=$1 seconds=$2 work=$3
    rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
    cp -r "$corpus"/. "$work/corpus/" 2>/dev/null || true
    status=0
    "$fuzzer" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" "$work/corpus" > "$work/log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n1)
    echo "$name: ${runs:-?} executions in ${seconds} s, corpus $(ls "$corpus" | wc -l) -> $(ls "$work/corpus" | wc -l) inputs, exit status $status"
    if [ "$status" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
      tail -n 60 "$work/log"
      for a in "$work/artifacts"/*; do
        [ -f "$a" ] || continue
        echo "$name: crashing input $a:"; od -An -tx1 "$a" | head -n 20
      done
      exit 1
    fi
    ;;
  *) echo "usage: run.sh replay|fuzz ..." >&2; exit 2 ;;
esac
