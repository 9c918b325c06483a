#!/usr/bin/env bash
# keel's main job (README): builds keel on libtorch 2.9.1 and 2.13.0 and
# reports what each build is. keel-compat's record/compare report takes
# its place here once it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-deps.sh
for preset in torch-2.9 torch-2.13; do
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" --target keel-info
done
for preset in torch-2.9 torch-2.13; do
  echo
  echo "===== build/$preset ====="
  "build/$preset/keel-info"
done
