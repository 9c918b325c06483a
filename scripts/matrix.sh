#!/usr/bin/env bash
# Builds and tests keel on libtorch releases, one after the other, and prints
# a table release x (C++ standard, configure, build, tests, compare against
# the golden release's recording with each adapter).
#
#   scripts/matrix.sh                 every supported release (cmake/torch-releases.txt);
#                                     the table also goes to docs/releases.md
#   scripts/matrix.sh 2.14.1 2.15.0   the given releases (any torch on PyPI)
#   scripts/matrix.sh --newest        the newest torch the package registry offers:
#                                     a new release, tried before users hit it
#
# Each release is the release preset (g++, every ctest test, soak rounds
# from KEEL_SOAK_ROUNDS, default 10 here) in build/torch-<release>. The golden
# (the first supported release) is recorded once, in its own build, and every
# release is compared against it with each adapter it has. A release that
# fails a step is reported and the next one runs. Exit status 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=releases.sh
source scripts/releases.sh
# shellcheck source=pipeline.sh
source scripts/pipeline.sh
export KEEL_SOAK_ROUNDS=${KEEL_SOAK_ROUNDS:-10}

releases=("$@")
write_docs=0
if [ ${#releases[@]} -eq 0 ]; then
  releases=("${keel_releases[@]}")
  write_docs=1
elif [ "${releases[*]}" = --newest ]; then
  newest=$(python3 -m pip index versions torch 2>/dev/null | sed -n 's/^torch (\(.*\))$/\1/p')
  [ -n "$newest" ] || { echo "keel matrix: the package registry did not answer" >&2; exit 2; }
  echo "keel matrix: the newest torch on the registry is $newest (newest supported: $keel_newest)"
  releases=("$newest")
fi

out=build/matrix
mkdir -p "$out"
golden=$out/golden-$keel_golden.safetensors
rows=()
failed=0

# step NAME LOG COMMAND...: runs COMMAND with its output in LOG; prints ok or the log's tail.
step() {
  local name=$1 log=$2
  shift 2
  if "$@" >"$log" 2>&1; then
    return 0
  fi
  echo "keel matrix: $name failed; the end of $log:" >&2
  tail -n 30 "$log" >&2
  return 1
}

record_golden() {
  [ -f "$golden" ] && return 0
  local b=build/torch-$keel_golden
  scripts/fetch-deps.sh "$keel_golden" >/dev/null &&
    KEEL_TORCH_RELEASE=$keel_golden cmake --preset release >/dev/null &&
    cmake --build "$b" --target keel-compat >/dev/null &&
    "$b/keel-compat" record --out "$golden" >/dev/null
}

# compare_cell BUILD ADAPTER JSON: the compare's one-line summary ("-" where
# the build has no such adapter); compare's status.
compare_cell() {
  local build=$1 adapter=$2 json=$3 rc=0
  if ! keel_has_adapter "$build" "$adapter"; then
    echo "-"
    return 0
  fi
  keel_compare "$build" "$golden" "$adapter" "$json" >/dev/null 2>&1 || rc=$?
  if [ ! -f "$json" ]; then echo "error ($rc)"; return 1; fi
  keel_compare_line "$json"
  return "$rc"
}

# The table so far, into build/matrix/table.md and, for the full matrix,
# docs/releases.md: written after every release, so that a run stopped
# midway still leaves the rows it finished.
write_table() {
  {
    echo "| release | standard | configure | build | tests (ctest) | compare, compat adapter | compare, native adapter | minutes |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } >"$out/table.md"
  [ $write_docs -eq 1 ] || return 0
  {
    cat <<EOF
# keel on every supported libtorch release

Written by \`scripts/matrix.sh\` (every release of \`cmake/torch-releases.txt\`,
one after the other) on $(date -u '+%Y-%m-%d %H:%M UTC'), keel commit
\`$(git rev-parse --short HEAD)\`$(git diff --quiet HEAD -- . ':!docs/releases.md' || echo ' with uncommitted changes'), on
$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(. /etc/os-release && echo "$PRETTY_NAME"), $(c++ --version | head -n1).
Each release: the \`release\` preset (g++, every ctest test, the soak at
$KEEL_SOAK_ROUNDS rounds; "skipped": the CUDA suite without a GPU, and the
numeric suites of an adapter that declines the operation); "compare" replays the golden recorded on
$keel_golden in that release's keel-compat with each adapter; each cell is
keel-compat's own one-line summary (a case the adapter declines counts as
skipped, with its reason in the report; "-" where the build has no such
adapter). Logs:
\`build/matrix/<release>/\`.

EOF
    cat "$out/table.md"
  } >docs/releases.md
}

for r in "${releases[@]}"; do
  t0=$(date +%s)
  b=build/torch-$r
  log=$out/$r
  mkdir -p "$log"
  std="?" cfg="-" bld="-" tests="-" cmp_compat="-" cmp_native="-" cmp_failed=0
  echo "keel matrix: ===== libtorch $r ====="
  if ! step fetch "$log/fetch.log" scripts/fetch-deps.sh "$r"; then
    cfg="no wheel"
  elif ! KEEL_TORCH_RELEASE=$r step configure "$log/configure.log" cmake --preset release; then
    cfg="failed"
  else
    cfg="ok"
    warn=$(grep -c "is untested" "$log/configure.log" || true)
    [ "$warn" -gt 0 ] && cfg="ok (untested)"
    std=$(sed -n 's/^KEEL_CXX_STANDARD:STRING=//p' "$b/CMakeCache.txt")
    if ! step build "$log/build.log" cmake --build "$b"; then
      bld="failed"
    else
      bld="ok"
      (cd "$b" && ctest --output-on-failure -j 2 --timeout 900) >"$log/ctest.log" 2>&1
      tests=$(keel_ctest_totals "$log/ctest.log")
      [ -n "$tests" ] || tests="did not finish"
      if record_golden; then
        cmp_compat=$(compare_cell "$b" compat "$log/compare-compat.json") || cmp_failed=1
        cmp_native=$(compare_cell "$b" native "$log/compare-native.json") || cmp_failed=1
      else
        cmp_compat="no golden"
      fi
    fi
  fi
  minutes=$(( ($(date +%s) - t0 + 30) / 60 ))
  row="| $r | C++$std | $cfg | $bld | $tests | $cmp_compat | $cmp_native | $minutes |"
  case "$row" in *"| ok | ok | "*", 0 failed | "*) ;; *) failed=1 ;; esac
  case "$cmp_compat$cmp_native" in *"error ("*|*golden*) failed=1 ;; esac
  [ $cmp_failed -eq 0 ] || failed=1
  rows+=("$row")
  echo "$row"
  write_table
done

echo
cat "$out/table.md"
[ $write_docs -eq 0 ] || echo "keel matrix: wrote docs/releases.md"
exit $failed
