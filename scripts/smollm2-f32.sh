#!/usr/bin/env bash
# smollm2-f32.sh PYTHON: the path of SmolLM2-135M-Instruct's weights written
# as an F32 GGUF (what llama.cpp runs at keel's precision), written once with
# the gguf package of PYTHON's environment (the peers', scripts/peers-setup.sh)
# from the published Q4_1 file that scripts/fetch-deps.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
deps_dir=${KEEL_DEPS_DIR:-$HOME/.cache/keel}
model=$deps_dir/models/smollm2-135m-instruct
f32=$deps_dir/models/smollm2-135m-instruct-f32/SmolLM2-135M-Instruct.F32.gguf
if [ ! -f "$f32" ]; then
  mkdir -p "$(dirname "$f32")"
  "$1" tests/bench/peers/gguf_f32.py "$model/SmolLM2-135M-Instruct.Q4_1.gguf" "$f32.tmp" >&2
  mv "$f32.tmp" "$f32"
fi
echo "$f32"
