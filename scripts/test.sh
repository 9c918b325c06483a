#!/usr/bin/env bash
# keel's test command (README, .ci/run): installs what is missing, then
# configures, builds and tests keel against libtorch 2.9.1 and 2.13.0, and
# builds the CUDA configuration.
#
# libtorch 2.9.1 is tested in the sanitizer build (clang, ASan + UBSan on
# keel's code): every unit, conformance, distributed and keel-compat test,
# the fuzz targets' regression inputs and a one-minute campaign per target.
# libtorch 2.13.0 is tested in the release build (g++), which also checks
# libkeel's ABI against abi/. One build per release keeps CI near half an
# hour on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-deps.sh
for preset in torch-2.9-sanitize torch-2.13; do
  echo "keel: ===== $preset ====="
  cmake --workflow --preset "$preset"
done
# The CUDA configuration is built, not run: CI has no GPU (scripts/gpu-check.sh
# runs it where there is one). The library, keel-compat and the GPU bench;
# the test binary's sources are all compiled by the CPU builds.
echo "keel: ===== torch-2.13-cuda (build only) ====="
cmake --workflow --preset torch-2.13-cuda
# The upgrade check across releases: record on 2.9.1, compare on 2.13.0
# with each adapter; any case out of tolerance fails CI. The recording runs
# in the sanitizer build, under the same sanitizer settings as its tests.
mkdir -p build/upgrade-check
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/sanitizers/ubsan.supp
build/torch-2.9-sanitize/keel-compat record --out build/upgrade-check/golden-2.9.1.safetensors
unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
for backend in compat native; do
  build/torch-2.13/keel-compat compare --golden build/upgrade-check/golden-2.9.1.safetensors \
    --backend "$backend" --repeat 2 --json "build/upgrade-check/compare-$backend.json"
done
scripts/lint.sh build/torch-2.13
echo "keel: all tests passed on libtorch 2.9.1 (sanitized) and 2.13.0"
