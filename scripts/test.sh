#!/usr/bin/env bash
# keel's test command (README, .ci/run): installs what is missing, then
# builds and tests keel on the releases of cmake/torch-releases.txt that add
# coverage, and prints each release's test totals.
#
#   the first (golden) release   sanitizer build (clang, ASan + UBSan): every unit,
#                                conformance, distributed and keel-compat test but
#                                SmolLM2's logits, the fuzz targets' regressions and a
#                                20-second campaign each
#   the newest release           release build (g++): every test but the three that
#                                do not depend on the release and ran above (the
#                                fault soak, the server's hostile suite, tiny_lm's
#                                training test: the stage across releases trains it
#                                here); the ABI check; the
#                                conformance suites again on AVX2's code paths
#   releases tagged "ci"         the targets those steps use (conformance preset):
#                                the conformance suites of the native adapter and
#                                SmolLM2, gloo's layout and the package test
#   lint                         clang-tidy with the sanitizer build's clang PCH
#   the newest release, CUDA     built, not run (no GPU here; scripts/gpu-check.sh)
#   the golden release           its release plugin and the C consumer, which runs on
#                                every release's plugin, as does C ABI 1.0's consumer
#   across releases              the golden recorded on the first release and compared
#                                on each other one with each adapter; SmolLM2's logits and
#                                greedy tokens (examples/models) likewise
#
# Every release, in full: scripts/matrix.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=releases.sh
source scripts/releases.sh
# shellcheck source=pipeline.sh
source scripts/pipeline.sh
scripts/fetch-deps.sh
start=$(date +%s)
summary=()
stages=()
stage_start=$start
# stage NAME: the minutes since the previous stage, printed at the end.
stage() {
  local now
  now=$(date +%s)
  stages+=("$(awk -v n="$1" -v s=$((now - stage_start)) 'BEGIN { printf "%-40s %5.1f min", n, s / 60 }')")
  stage_start=$now
}

# run_suite LABEL CONFIGURE_PRESET PRESET RELEASE [ctest args...]: configure,
# build and test (PRESET: the build and test presets); the totals go in the summary.
run_suite() {
  local label=$1 configure=$2 preset=$3 release=$4 log status
  shift 4
  echo "keel: ===== $label: libtorch $release ($preset) ====="
  export KEEL_TORCH_RELEASE=$release
  cmake --preset "$configure" >/dev/null
  cmake --build --preset "$preset"
  log=$(mktemp)
  status=0
  ctest --preset "$preset" "$@" 2>&1 | tee "$log" || status=$?
  summary+=("$(printf '%-8s %-9s %-28s %s' "$release" "$preset" "$label" "$(keel_ctest_totals "$log")")")
  rm -f "$log"
  return $status
}
build_dir() { if [ "$2" = release ]; then echo "build/torch-$1"; else echo "build/torch-$1-$2"; fi; }

# SmolLM2's logits and tokens against transformers run in the release
# builds; the golden release's recording below runs the model under ASan.
run_suite "every test but SmolLM2's logits" sanitize sanitize "$keel_golden" -E '^Prompts/SmolLM2Conformance\.'
stage "$keel_golden sanitize: build and test"
run_suite "every test but 3 run above" release release "$keel_newest" \
  -E '^CommDistributed\.SoakRandomFaults|^examples\.tiny_lm_trains|^examples\.serve_survives'
stage "$keel_newest release: build and test"
# Another CPU's code paths: the conformance suites again with libtorch's
# kernels, MKL and oneDNN held to AVX2 (what an AMD CPU runs in MKL); every
# numeric bound must hold under it (docs/hardening.md). The SSE4-only paths
# (ATen's "default", which no CPU here runs) are on demand:
# scripts/cpu-paths.sh build/torch-<release> default.
rm -f "$(build_dir "$keel_newest" release)/cpu-paths.txt"
scripts/cpu-paths.sh "$(build_dir "$keel_newest" release)" avx2
summary+=("$(cat "$(build_dir "$keel_newest" release)/cpu-paths.txt")")
stage "$keel_newest conformance under avx2"
# The compat adapter's suites ran on the releases around these (2.9.1 under
# ASan, the newest in full), and its numbers on these are judged below
# (keel-compat across releases); here run what is theirs: the native
# adapter's suites, gloo's layout, the package and SmolLM2 against
# transformers.
for r in "${keel_ci_extra[@]}"; do
  run_suite "conformance less compat's, gloo, package" release conformance "$r" -E '/compat($|_)'
  stage "$r conformance: build and test"
done

# The CUDA configuration is built, not run: CI has no GPU (scripts/gpu-check.sh
# runs it where there is one). The library, keel-compat and the GPU bench;
# the test binary's sources are all compiled by the CPU builds.
echo "keel: ===== CUDA build (not run): libtorch $keel_newest ====="
KEEL_TORCH_RELEASE=$keel_newest cmake --workflow --preset cuda
summary+=("$(printf '%-8s %-9s %-28s %s' "$keel_newest" cuda "library and tools" "built")")
stage "$keel_newest CUDA: build"

# The upgrade check across releases: record on the golden release, compare on
# every other release CI built, with each adapter; any case out of tolerance
# fails CI. The recording runs in the sanitizer build, under its settings.
golden=build/upgrade-check/golden-$keel_golden.safetensors
mkdir -p build/upgrade-check
(
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:suppressions=$PWD/tests/sanitizers/asan.supp
  export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/sanitizers/ubsan.supp
  "$(build_dir "$keel_golden" sanitize)/keel-compat" record --out "$golden"
)
for r in "${keel_ci_extra[@]}" "$keel_newest"; do
  for adapter in compat native; do
    json=build/upgrade-check/compare-$r-$adapter.json
    keel_compare "$(build_dir "$r" release)" "$golden" "$adapter" "$json"
    summary+=("$(printf '%-8s %-9s %-28s %s' "$r" "$adapter" "compare with $keel_golden" \
      "$(keel_compare_line "$json")")")
  done
done
stage "keel-compat across releases"
# The tiny language model (examples/tiny_lm) across releases: trained and
# recorded on the newest, replayed on every other release CI built; its
# deterministic outputs within the policy and its curves within the band.
tiny=build/upgrade-check/tiny_lm-$keel_newest.safetensors
"$(build_dir "$keel_newest" release)/tiny_lm" --record "$tiny" >/dev/null
for r in "${keel_ci_extra[@]}"; do
  json=build/upgrade-check/tiny_lm-$r.json
  "$(build_dir "$r" release)/tiny_lm" --compare "$tiny" --repeat 1 --json "$json" > "$json.txt"
  summary+=("$(printf '%-8s %-9s %-28s %s' "$r" function "tiny_lm trained on $keel_newest" \
    "$(keel_compare_line "$json")")")
done
stage "tiny_lm across releases"
# SmolLM2-135M-Instruct (examples/models) across releases: its last-position
# logits and 32 greedy tokens for three prompts, recorded on the golden
# release and replayed on every other release CI built (tokens exact, logits
# within 1e-3; tests/models compares the same model with transformers).
smol=build/upgrade-check/smollm2-$keel_golden.safetensors
(
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:suppressions=$PWD/tests/sanitizers/asan.supp
  export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/sanitizers/ubsan.supp
  "$(build_dir "$keel_golden" sanitize)/keel-generate" --record "$smol"
)
for r in "${keel_ci_extra[@]}" "$keel_newest"; do
  json=build/upgrade-check/smollm2-$r.json
  "$(build_dir "$r" release)/keel-generate" --compare "$smol" --json "$json" | tee "$json.txt"
  summary+=("$(printf '%-8s %-9s %-28s %s' "$r" model "SmolLM2 recorded on $keel_golden" \
    "$(keel_compare_line "$json")")")
done
stage "SmolLM2 across releases"
# One service binary for every release (docs/c-api.md): the C consumer, a
# normal (non-sanitizer) service built once in the golden release's release
# build with no libtorch header in sight, runs unchanged on each release's
# release plugin; it records on the golden release and each other release's
# outputs must stay within the policy. Its hash is printed before and after,
# to show that the same file ran. Then the consumer of the commit that froze
# C ABI 1.0, built from that commit's sources, runs on the same plugins.
echo "keel: ===== $keel_golden release: the plugin and the C consumer ====="
(
  export KEEL_TORCH_RELEASE=$keel_golden
  cmake --preset release >/dev/null
  cmake --build --preset release --target keel_plugin keel_c_consumer
)
consumer=$(build_dir "$keel_golden" release)/keel_c_consumer
consumer_golden=build/upgrade-check/c-consumer-$keel_golden.safetensors
consumer_hash=$(sha256sum "$consumer" | cut -d' ' -f1)
plugins=()
for r in "$keel_golden" "${keel_ci_extra[@]}" "$keel_newest"; do
  plugins+=("$(build_dir "$r" release)/libkeel-plugin-$r-cpu.so")
done
echo "keel: ===== one C consumer binary, sha256 $consumer_hash ====="
(
  "$consumer" record --out "$consumer_golden" --plugin "${plugins[0]}"
  for r in "$keel_golden" "${keel_ci_extra[@]}" "$keel_newest"; do
    "$consumer" compare --golden "$consumer_golden" --torch-release "$r" \
      --plugin-dir "$(build_dir "$r" release)"
    scripts/c-consumer-comm.sh "$consumer" --torch-release "$r" --plugin-dir "$(build_dir "$r" release)"
  done
) | tee build/upgrade-check/c-consumer.log
[ "$(sha256sum "$consumer" | cut -d' ' -f1)" = "$consumer_hash" ]
for r in "$keel_golden" "${keel_ci_extra[@]}" "$keel_newest"; do
  summary+=("$(printf '%-8s %-9s %-28s %s' "$r" c-abi "one consumer binary" \
    "$(grep -A1 "built on libtorch $r" build/upgrade-check/c-consumer.log | sed -n 's/.*keel_c_consumer: \([0-9]* of [0-9]* cases pass\).*/\1, comm on 2 ranks passes/p' | head -n1)")")
done
scripts/abi-1.0-consumer.sh "$(build_dir "$keel_newest" release)/dlpack-include" "${plugins[@]}" |
  tee build/upgrade-check/c-abi-1.0.log
summary+=("$(printf '%-8s %-9s %-28s %s' all c-abi-1.0 "the 1.0 consumer" \
  "$(tail -n1 build/upgrade-check/c-abi-1.0.log | sed 's/^keel: //')")")
stage "C consumer across releases"
lint_builds=("$(build_dir "$keel_golden" sanitize)" "$(build_dir "$keel_newest" release)")
for r in "${keel_ci_extra[@]}"; do lint_builds+=("$(build_dir "$r" release)"); done
lint_builds+=("$(build_dir "$keel_newest" cuda)")  # the CUDA plugin's device file
scripts/lint.sh "${lint_builds[@]}"
stage "lint"

echo
echo "keel: test totals per release ($(( ($(date +%s) - start) / 60 )) min)"
printf '  %s\n' "${summary[@]}"
echo "keel: minutes per stage"
printf '  %s\n' "${stages[@]}"
echo "keel: all tests passed"
