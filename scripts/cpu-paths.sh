#!/usr/bin/env bash
# cpu-paths.sh BUILD_DIR ISA [ISA...]: another CPU's code paths. Reruns a
# release build's conformance suites with libtorch's kernels, MKL and oneDNN
# held to ISA, and prints one totals line per ISA (docs/hardening.md):
#   avx2     what MKL runs on an AMD CPU (CI runs it, scripts/test.sh)
#   default  no vector extension beyond SSE4 (ATen's "default"; on demand)
# Every numeric bound must hold under each. Left out: what no CPU path
# changes (the C ABI, compared with v1 on the same path) and SmolLM2 (the
# tokenizer, and logits whose bound is 20 times what they measure: the
# model's only CPU paths are ATen's products, which the kernels' suites
# cover under each ISA).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=pipeline.sh
source scripts/pipeline.sh
build=$1
shift
status=0
for isa in "$@"; do
  log=$(mktemp)
  exclude=(-LE 'c_api|model')
  case $isa in
    avx2) isa_env=(MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2) ;;
    default) isa_env=(MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41) ;;
    *) echo "cpu-paths.sh: ISA is avx2 or default, not '$isa'" >&2; exit 2 ;;
  esac
  env ATEN_CPU_CAPABILITY="$isa" "${isa_env[@]}" \
    ctest --test-dir "$build" -j2 --timeout 600 --output-on-failure -L conformance "${exclude[@]}" 2>&1 |
    tee "$log" || status=$?
  printf '%-8s %-9s %-28s %s\n' "$(basename "$build" | sed 's/^torch-//')" "$isa" \
    "conformance, CPU paths $isa" "$(keel_ctest_totals "$log")" >> "$build/cpu-paths.txt"
  rm -f "$log"
done
exit $status
