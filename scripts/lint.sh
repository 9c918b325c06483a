#!/usr/bin/env bash
# clang-tidy (.clang-tidy) over keel's own sources, using a build's
# compile_commands.json. GCC's precompiled header is not readable by clang,
# so the -include of it is dropped from a private copy of the commands.
#   scripts/lint.sh build/torch-2.13
set -euo pipefail
build=${1:?usage: scripts/lint.sh BUILD_DIR}
cd "$(dirname "$0")/.."
git ls-files '*.h' '*.cpp' | xargs clang-format --dry-run -Werror
echo "keel: clang-format clean"
lint_dir="$build/lint"
mkdir -p "$lint_dir"
python3 - "$build/compile_commands.json" "$lint_dir/compile_commands.json" <<'PY'
import json, re, sys
commands = json.load(open(sys.argv[1]))
for c in commands:
    c["command"] = re.sub(r"-include \S*cmake_pch\.hxx|-Winvalid-pch", "", c["command"])
json.dump(commands, open(sys.argv[2], "w"), indent=1)
PY
mapfile -t files < <(git ls-files 'src/*.cpp' 'adapters/*.cpp' 'kernels/*.cpp' 'examples/*.cpp' |
  while read -r f; do grep -q "\"file\": \"$PWD/$f\"" "$lint_dir/compile_commands.json" && echo "$f"; done)
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy --quiet -p "$lint_dir"
echo "keel: clang-tidy clean on ${#files[@]} files"
