#!/usr/bin/env bash
# Writes tests/models/reference/: what transformers and HF tokenizers give for
# SmolLM2-135M-Instruct (tests/models/make_reference.py says what). On demand,
# never in CI: it needs the peers' environment (scripts/peers-setup.sh, torch
# 2.13.0 with transformers) and takes about two minutes here.
#
#   scripts/model-reference.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deps_dir=${KEEL_DEPS_DIR:-$HOME/.cache/keel}
scripts/fetch-deps.sh >/dev/null
scripts/peers-setup.sh >/dev/null
"$deps_dir/peers-venv/bin/peers-python" tests/models/make_reference.py \
  "$deps_dir/models/smollm2-135m-instruct" tests/models/reference
