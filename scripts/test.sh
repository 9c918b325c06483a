#!/usr/bin/env bash
# keel's test command (README, .ci/run): installs what is missing, then
# configures, builds and tests keel against libtorch 2.9.1 and 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-deps.sh
for preset in torch-2.9 torch-2.13; do
  echo "keel: ===== $preset ====="
  cmake --workflow --preset "$preset"
done
scripts/lint.sh build/torch-2.13
echo "keel: all tests passed on libtorch 2.9.1 and 2.13.0"
