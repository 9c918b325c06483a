#!/usr/bin/env bash
# keel's main job (README): the upgrade story from a fresh machine. Builds
# keel on each release named, records the canonical suite on the --from
# release, replays it on every --to release with each adapter that release
# has, trains the tiny language model (examples/tiny_lm) on every release
# and replays the --from release's training record on the others, runs
# SmolLM2-135M-Instruct (examples/models) on every release (its greedy texts
# and logits recorded on --from and judged on the others, its prefill and
# decode speed and peak memory), serves SmolLM2 on each release under load
# (examples/serve), and
# prints one summary row per pair and the path of the report's front page
# (build/upgrade-report/index.html: self-contained, readable offline).
#
#   scripts/upgrade-report.sh                          # first supported -> the "ci"
#                                                      # releases and the newest
#   scripts/upgrade-report.sh --from 2.13.0 --to 2.15.0
#   scripts/upgrade-report.sh --from 2.9.1 --to 2.12.1 --to 2.14.1
#
# Releases come from cmake/torch-releases.txt; any other torch on PyPI works
# too (configure warns that it is untested). Exit status 1 if any case moved
# out of tolerance, 2 on bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=releases.sh
source scripts/releases.sh
# shellcheck source=pipeline.sh
source scripts/pipeline.sh

usage() {
  echo "usage: scripts/upgrade-report.sh [--from RELEASE] [--to RELEASE]..." >&2
  exit 2
}
from=$keel_golden
to=()
while [ $# -gt 0 ]; do
  case $1 in
    --from) [ $# -ge 2 ] || usage; from=$2; shift 2 ;;
    --to) [ $# -ge 2 ] || usage; to+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
[ ${#to[@]} -gt 0 ] || to=("${keel_ci_extra[@]}" "$keel_newest")
for r in "$from" "${to[@]}"; do
  [[ $r =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "keel: '$r' is not a release like 2.13.0" >&2; usage; }
done

mapfile -t all < <(printf '%s\n' "$from" "${to[@]}" | awk '!seen[$0]++')
scripts/fetch-deps.sh "${all[@]}"
for r in "${all[@]}"; do
  KEEL_TORCH_RELEASE=$r cmake --preset release >/dev/null
  cmake --build "build/torch-$r" --target keel-info keel-compat tiny_lm keel-serve keel-serve-load \
    keel-generate
done

out=build/upgrade-report
mkdir -p "$out"
for r in "${all[@]}"; do
  echo
  "build/torch-$r/keel-info"
done
echo
golden=$out/golden-$from.safetensors
"build/torch-$from/keel-compat" record --out "$golden"

status=0
rows=()
suites=()
for r in "${to[@]}"; do
  for adapter in compat native; do
    keel_has_adapter "build/torch-$r" "$adapter" || continue
    echo
    echo "keel: ===== $from -> $r, $adapter adapter ====="
    base=$out/compare-$from-to-$r-$adapter
    # Three runs per case: the report's timing ratios are medians of three.
    KEEL_COMPARE_REPEAT=3 keel_compare "build/torch-$r" "$golden" "$adapter" "$base.json" \
      --html "$base.html" || status=1
    suites+=(--suite "$base.json")
    rows+=("$(python3 - "$base.json" "$from" "$r" "$adapter" "$base.html" <<'PY'
import json, sys
path, a, b, adapter, html = sys.argv[1:]
cases = json.load(open(path))["cases"]
count = lambda s: sum(c["status"] == s for c in cases)
served = sum(c["adapter"]["now"] == adapter for c in cases)
bad = len(cases) - count("pass") - count("skipped")
print(f"{a:>7} -> {b:<7} {adapter:<7} {len(cases):>5} {count('pass'):>5} {count('skipped'):>7} {bad:>5}"
      f" {served:>7}   {html}")
PY
)")
  done
done

# Every build has the compat adapter: no row at all is a broken step, not a
# pass.
[ ${#rows[@]} -gt 0 ] || { echo "keel: no release was compared" >&2; status=1; }
# The tiny model: trained and recorded on --from, then trained on each --to
# release and judged against that record (docs/tiny-lm.md).
echo
echo "keel: ===== tiny_lm: trained on $from ====="
tiny=$out/tiny_lm-$from.safetensors
"build/torch-$from/tiny_lm" --record "$tiny" --curve "$out/tiny_lm-curve-$from.json"
index_args=(--tiny-lm "$out/tiny_lm-curve-$from.json")
for r in "${to[@]}"; do
  echo
  echo "keel: ===== tiny_lm: trained on $r, judged against $from ====="
  "build/torch-$r/tiny_lm" --compare "$tiny" --repeat 2 --json "$out/tiny_lm-$from-to-$r.json" \
    --html "$out/tiny_lm-$from-to-$r.html" --curve "$out/tiny_lm-curve-$r.json" || status=1
  index_args+=(--tiny-lm "$out/tiny_lm-curve-$r.json" --compare "$out/tiny_lm-$from-to-$r.json")
done
# SmolLM2-135M-Instruct from its published weights (examples/models): its
# greedy texts and last-position logits recorded on --from and judged on each
# --to release (texts identical, logits within 1e-3), and each release's
# speed and peak memory in float32 and bfloat16.
echo
echo "keel: ===== SmolLM2-135M-Instruct: recorded on $from ====="
smol=$out/smollm2-$from.safetensors
"build/torch-$from/keel-generate" --record "$smol" --texts "$out/smollm2-texts-$from.json"
index_args+=(--smollm2-texts "$out/smollm2-texts-$from.json")
for r in "${to[@]}"; do
  echo
  echo "keel: ===== SmolLM2-135M-Instruct on $r, judged against $from ====="
  "build/torch-$r/keel-generate" --compare "$smol" --json "$out/smollm2-$from-to-$r.json" \
    --texts "$out/smollm2-texts-$r.json" || status=1
  index_args+=(--smollm2-texts "$out/smollm2-texts-$r.json"
               --smollm2-compare "$out/smollm2-$from-to-$r.json")
  rows+=("$(python3 - "$out/smollm2-$from-to-$r.json" "$from" "$r" <<'PY'
import json, sys
path, a, b = sys.argv[1:]
cases = json.load(open(path))["cases"]
count = lambda s: sum(c["status"] == s for c in cases)
bad = len(cases) - count("pass") - count("skipped")
print(f"{a:>7} -> {b:<7} {'smollm2':<7} {len(cases):>5} {count('pass'):>5} {count('skipped'):>7} {bad:>5}"
      f" {'-':>7}   {path}")
PY
)")
done
for r in "${all[@]}"; do
  for dtype in float32 bfloat16; do
    echo "keel: ===== SmolLM2-135M-Instruct on $r, $dtype: speed and memory ====="
    "build/torch-$r/keel-generate" --bench --dtype "$dtype" --json "$out/smollm2-bench-$r-$dtype.json" ||
      status=1
    index_args+=(--smollm2-bench "$out/smollm2-bench-$r-$dtype.json")
  done
done
# SmolLM2 served on each release under load (docs/serving.md): throughput
# and latency per release.
for r in "${all[@]}"; do
  echo
  echo "keel: ===== keel-serve on $r: SmolLM2-135M-Instruct, 8 and 32 clients ====="
  "build/torch-$r/keel-serve-load" --server "build/torch-$r/keel-serve" \
    --model "${KEEL_DEPS_DIR:-$HOME/.cache/keel}/models/smollm2-135m-instruct" --clients 8,32 \
    --modes continuous,static --threads 2 --time-limit 300 --json "$out/serve-$r.json" || status=1
  index_args+=(--serve "$out/serve-$r.json")
done
python3 scripts/upgrade_index.py --out "$out/index.html" --title "keel upgrade report: $from -> ${to[*]}" \
  "${index_args[@]}" "${suites[@]}"

echo
echo "keel: upgrade report, one row per pair (cases recorded on $from; skipped: the adapter declines the case, with its reason in the report; served: cases the adapter ran itself)"
printf '%7s    %-7s %-7s %5s %5s %7s %5s %7s   %s\n' from to adapter cases pass skipped fail served report
printf '%s\n' "${rows[@]}"
echo "keel: the report's front page, with SmolLM2's texts per release and the tiny model's curves: $out/index.html"
exit $status
