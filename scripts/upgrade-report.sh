#!/usr/bin/env bash
# keel's main job (README): the upgrade story from a fresh machine. Builds
# keel on libtorch 2.9.1 and 2.13.0, records the canonical suite on 2.9.1,
# compares it on 2.13.0 with both adapters, and prints the summary and the
# path of the HTML report. Exit status 1 if any case moved out of tolerance.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-deps.sh
for preset in torch-2.9 torch-2.13; do
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" --target keel-info keel-compat
done
out=build/upgrade-report
mkdir -p "$out"
for preset in torch-2.9 torch-2.13; do
  echo
  "build/$preset/keel-info"
done
echo
build/torch-2.9/keel-compat record --out "$out/golden-2.9.1.safetensors"
status=0
for backend in compat native; do
  echo
  build/torch-2.13/keel-compat compare --golden "$out/golden-2.9.1.safetensors" \
    --backend "$backend" --repeat 3 \
    --json "$out/compare-2.13.0-$backend.json" --html "$out/compare-2.13.0-$backend.html" || status=1
done
echo
echo "keel: upgrade report 2.9.1 -> 2.13.0: $PWD/$out/compare-2.13.0-compat.html and $PWD/$out/compare-2.13.0-native.html"
exit $status
