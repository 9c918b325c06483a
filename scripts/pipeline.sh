# Sourced by keel's scripts (test.sh, matrix.sh, upgrade-report.sh): the
# steps of the release pipeline (record on one release, compare on others,
# summarise), written once.
#   keel_ctest_totals LOG         ctest's totals as "P passed, S skipped, F failed"
#   keel_has_adapter BUILD NAME   whether that build's keel has the adapter
#   keel_compare BUILD GOLDEN ADAPTER JSON [FLAGS...]
#                                 replays GOLDEN with that build's keel-compat and
#                                 the adapter (KEEL_COMPARE_REPEAT runs per case,
#                                 default 2), its report on stdout, its status
#   keel_compare_line JSON        the report's one-line summary (`N passed, F failed,
#                                 ...`), as keel-compat (or keel::compat::to_text, as
#                                 tiny_lm) printed it beside JSON, in JSON.txt
# shellcheck shell=bash

# ctest counts a skipped test among the passed; its list names them "(Skipped)".
keel_ctest_totals() {
  local skipped
  skipped=$(grep -c '(Skipped)' "$1" || true)
  sed -n 's/.*tests passed, \([0-9]*\) tests\? failed out of \([0-9]*\).*/\2 \1/p' "$1" | tail -n1 |
    awk -v s="$skipped" '{printf "%d passed, %d skipped, %d failed", $1 - $2 - s, s, $2}'
}

keel_has_adapter() {
  local info
  # The JSON first, then grep: grep -q stops reading early, and under
  # pipefail keel-info's SIGPIPE would read as "no such adapter".
  info=$("$1/keel-info" --json) || return 1
  grep -q "\"name\": \"$2\"" <<<"$info"
}

keel_compare() {
  local build=$1 golden=$2 adapter=$3 json=$4 status=0
  shift 4
  "$build/keel-compat" compare --golden "$golden" --backend "$adapter" \
    --repeat "${KEEL_COMPARE_REPEAT:-2}" --json "$json" "$@" | tee "$json.txt" || status=$?
  return $status
}

keel_compare_line() {
  [ -f "$1.txt" ] && sed -n -E '/^[0-9]+ passed, [0-9]+ failed/p' "$1.txt" | tail -n1
}
