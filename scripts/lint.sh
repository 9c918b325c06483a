#!/usr/bin/env bash
# clang-format, then clang-tidy (.clang-tidy) over keel's own sources, each
# file with the compile_commands.json of the first build given that compiles
# it (a file some release's build leaves out, like the native adapter before
# 2.13, is read in the next build that has it).
#
# A clang build (the sanitize preset) is read as it is: clang-tidy loads its
# precompiled ATen headers, which takes 40% off each file. GCC's precompiled
# header is not readable by clang, so from a g++ build the -include of it is
# dropped, in a private copy of the commands. Each file's clean result is
# cached (scripts/lint_tidy.py): a file is linted again only when it, its
# command, a header it reads or the checks changed.
#   scripts/lint.sh build/torch-2.9.1-sanitize build/torch-2.15.0
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/lint.sh BUILD_DIR [BUILD_DIR...]" >&2; exit 2; }
cd "$(dirname "$0")/.."
git ls-files '*.h' '*.cpp' | xargs clang-format --dry-run -Werror
echo "keel: clang-format clean"
mapfile -t left < <(git ls-files 'src/*.cpp' 'compat/*.cpp' 'adapters/*.cpp' 'kernels/*.cpp' 'examples/*.cpp' 'c_api/*.cpp')
total=0
for build in "$@"; do
  lint_dir="$build/lint"
  mkdir -p "$lint_dir"
  python3 - "$build/compile_commands.json" "$lint_dir/compile_commands.json" <<'PY'
import json, re, sys
commands = json.load(open(sys.argv[1]))
for c in commands:
    if "-include-pch" not in c["command"]:
        c["command"] = re.sub(r"-include \S*cmake_pch\.hxx|-Winvalid-pch", "", c["command"])
json.dump(commands, open(sys.argv[2], "w"), indent=1)
PY
  files=()
  rest=()
  for f in "${left[@]}"; do
    if grep -q "\"file\": \"$PWD/$f\"" "$lint_dir/compile_commands.json"; then files+=("$f"); else rest+=("$f"); fi
  done
  left=("${rest[@]}")
  [ ${#files[@]} -gt 0 ] || continue
  python3 scripts/lint_tidy.py "$lint_dir" "$build" "${files[@]}"
  echo "keel: clang-tidy clean on ${#files[@]} files in $build"
  total=$((total + ${#files[@]}))
done
echo "keel: clang-tidy clean on $total files; in no build given: ${#left[@]}"
