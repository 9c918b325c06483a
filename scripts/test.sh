#!/usr/bin/env bash
# keel's test command (README, .ci/run): installs what is missing, then
# configures, builds and tests keel against libtorch 2.9.1 and 2.13.0, and
# builds the CUDA configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-deps.sh
for preset in torch-2.9 torch-2.13; do
  echo "keel: ===== $preset ====="
  cmake --workflow --preset "$preset"
done
# The CUDA configuration is built, not run: CI has no GPU (scripts/gpu-check.sh
# runs it where there is one).
echo "keel: ===== torch-2.13-cuda (build only) ====="
cmake --workflow --preset torch-2.13-cuda
# The upgrade check across releases: record on 2.9.1, compare on 2.13.0
# with each adapter; any case out of tolerance fails CI.
mkdir -p build/upgrade-check
build/torch-2.9/keel-compat record --out build/upgrade-check/golden-2.9.1.safetensors
for backend in compat native; do
  build/torch-2.13/keel-compat compare --golden build/upgrade-check/golden-2.9.1.safetensors \
    --backend "$backend" --repeat 2 --json "build/upgrade-check/compare-$backend.json"
done
scripts/lint.sh build/torch-2.13
echo "keel: all tests passed on libtorch 2.9.1 and 2.13.0"
