#!/usr/bin/env bash
# SmolLM2-135M-Instruct, one stream: keel against llama.cpp and transformers
# (tests/bench/peers/smollm2_peers.py says how; docs/benchmarks.md has the
# table). On demand, never in CI: it builds llama-cpp-python from source into
# the peers' environment once (about 10 minutes on 2 cores) and takes about 5
# minutes a run.
#
#   scripts/model-bench.sh [--rounds N] [--json F]
set -euo pipefail
cd "$(dirname "$0")/.."
deps_dir=${KEEL_DEPS_DIR:-$HOME/.cache/keel}
release=2.13.0  # the peers' torch: transformers runs on the release keel is built against
scripts/fetch-deps.sh "$release" >/dev/null
scripts/peers-setup.sh >/dev/null
py=$deps_dir/peers-venv/bin/peers-python
llama_version=0.3.36
if ! "$py" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$llama_version')" 2>/dev/null; then
  echo "keel: building llama-cpp-python $llama_version from source (llama.cpp, native CPU flags)"
  src=$deps_dir/wheels/peers-src
  mkdir -p "$src"
  python3 -m pip download --quiet --no-deps --no-binary=:all: "llama-cpp-python==$llama_version" -d "$src"
  python3 -m pip download --quiet --only-binary=:all: -d "$deps_dir/wheels/peers" \
    diskcache jinja2 MarkupSafe 'typing-extensions>=4.5' 'numpy>=1.20' scikit-build-core pathspec
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$deps_dir/peers-venv/bin/python" -m pip install --quiet --no-index \
    --find-links "$deps_dir/wheels/peers" --find-links "$src" "llama-cpp-python==$llama_version"
fi
model=$deps_dir/models/smollm2-135m-instruct
f32=$(scripts/smollm2-f32.sh "$py")
KEEL_TORCH_RELEASE=$release cmake --preset release >/dev/null
cmake --build "build/torch-$release" --target keel-generate
"$py" tests/bench/peers/smollm2_peers.py --keel "build/torch-$release/keel-generate" \
  --model-dir "$model" --f32-gguf "$f32" "$@"
