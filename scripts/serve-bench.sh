#!/usr/bin/env bash
# SmolLM2-135M-Instruct served under load: keel-serve against llama.cpp's
# OpenAI-compatible server (llama-server, parallel slots, continuous
# batching) on the same weights, 1, 8, 32 and 64 closed-loop clients
# (tests/bench/peers/serve_peers.py says how; docs/serving.md has the table).
# On demand, never in CI: it builds llama-server once from the llama.cpp that
# PyPI's llama-cpp-python sdist vendors (about 10 minutes on 2 cores; the
# same source scripts/model-bench.sh builds llama-cpp-python from) and takes
# about 10 minutes a run.
#
#   scripts/serve-bench.sh [--clients 1,8,32,64] [--threads 2] [--json F]
set -euo pipefail
cd "$(dirname "$0")/.."
deps_dir=${KEEL_DEPS_DIR:-$HOME/.cache/keel}
release=2.13.0  # the release scripts/model-bench.sh measures keel's model on
scripts/fetch-deps.sh "$release" >/dev/null
scripts/peers-setup.sh >/dev/null
py=$deps_dir/peers-venv/bin/peers-python
llama_version=0.3.36
src=$deps_dir/wheels/peers-src
server_dir=$deps_dir/llama-server-$llama_version
if [ ! -x "$server_dir/bin/llama-server" ]; then
  echo "keel: building llama-server from llama-cpp-python $llama_version's llama.cpp (native CPU flags)"
  mkdir -p "$src"
  [ -f "$src/llama_cpp_python-$llama_version.tar.gz" ] ||
    python3 -m pip download --quiet --no-deps --no-binary=:all: "llama-cpp-python==$llama_version" -d "$src"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar xzf "$src/llama_cpp_python-$llama_version.tar.gz" -C "$work" \
    "llama_cpp_python-$llama_version/vendor/llama.cpp"
  # No web UI (it would be downloaded) and no HTTPS: a loopback API server.
  cmake -S "$work/llama_cpp_python-$llama_version/vendor/llama.cpp" -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
  cmake --build "$work/build" --target llama-server
  mkdir -p "$server_dir/bin"
  cp "$work/build/bin/llama-server" "$server_dir/bin/llama-server.tmp"
  mv "$server_dir/bin/llama-server.tmp" "$server_dir/bin/llama-server"
fi
model=$deps_dir/models/smollm2-135m-instruct
f32=$(scripts/smollm2-f32.sh "$py")
KEEL_TORCH_RELEASE=$release cmake --preset release >/dev/null
cmake --build "build/torch-$release" --target keel-serve
"$py" tests/bench/peers/serve_peers.py --keel-serve "build/torch-$release/keel-serve" \
  --llama-server "$server_dir/bin/llama-server" --model-dir "$model" --f32-gguf "$f32" \
  --q4-gguf "$model/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
