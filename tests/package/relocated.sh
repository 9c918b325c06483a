#!/usr/bin/env bash
# An installed plugin loads wherever it is copied, on a machine where
# libtorch sits elsewhere (docs/c-api.md, "Relocatable plugins"):
#
#   1. install keel from BUILD_DIR into a prefix, and build a service
#      (examples/c_consumer) against the install alone, as a user would;
#   2. copy the prefix to another folder and delete the first, and put the
#      plugin's libtorch libraries in a third folder;
#   3. in a private mount namespace, hide the build tree and the libtorch
#      it was built against (empty tmpfs over each) and the system's abseil
#      (/dev/null over each file), then run the service
#      there with --torch-library-dir: it records every case through the
#      plugin and replays them.
#
#   tests/package/relocated.sh BUILD_DIR TORCH_LIB_DIR    (root, for the namespace)
set -euo pipefail
build=$(cd "${1:?usage: relocated.sh BUILD_DIR TORCH_LIB_DIR}" && pwd)
torch_lib=$(cd "${2:?usage: relocated.sh BUILD_DIR TORCH_LIB_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "relocated: SKIP: needs root for a private mount namespace"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
plugin=$(basename "$(ls "$work"/prefix/lib/libkeel-plugin-*-cpu.so)")
release=${plugin#libkeel-plugin-}
release=${release%-cpu.so}
runpath=$(readelf -d "$work/prefix/lib/$plugin" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
[ "$runpath" = '$ORIGIN' ] || { echo "relocated: FAIL: the plugin's RUNPATH is '$runpath'"; exit 1; }
c++ -std=c++17 -Wall -Wextra -Werror -I "$work/prefix/include" \
  "$root/examples/c_consumer/consumer.cpp" -L "$work/prefix/lib" -lkeel_loader \
  -Wl,-rpath,'$ORIGIN/../lib' -o "$work/prefix/bin/service"

cp -a "$work/prefix" "$work/moved"
rm -rf "$work/prefix"
# The libraries of libtorch the plugin reaches (hard links where the file
# system allows: nothing is copied then), and the version file the loader
# checks beside them.
mkdir -p "$work/torch/lib"
ldd "$build/$plugin" | awk -v dir="$torch_lib/" 'index($3, dir) == 1 {print $3}' |
  while read -r lib; do cp -l "$lib" "$work/torch/lib/" 2>/dev/null || cp "$lib" "$work/torch/lib/"; done
cp "$torch_lib/../version.py" "$work/torch/" 2>/dev/null || true

# What the moved plugin needs, listed without loading it.
"$build/keel-info" --plugin "$work/moved/lib/$plugin" --torch-library-dir "$work/torch/lib" --json \
  > "$work/needs.json"
python3 - "$work/needs.json" "$build" "$torch_lib" <<'PY'
import json, sys
needs = json.load(open(sys.argv[1]))
moved = sys.argv[1].rsplit("/", 1)[0] + "/moved/lib/"
bad = [n for n in needs["needed"] if n["path"] is None or
       n["path"].startswith((sys.argv[2], sys.argv[3])) or
       (n["name"].startswith("libabsl_") and not n["path"].startswith(moved))]
if not needs["ok"] or bad:
    sys.exit(f"relocated: FAIL: keel-info --plugin: {bad or needs}")
print(f"relocated: keel-info --plugin: {len(needs['needed'])} libraries, none from the build, "
      "abseil's from beside the plugin")
PY

# The build tree, the original libtorch and the system's abseil gone: only
# the moved install, the copied libtorch and the C and C++ runtimes remain.
unshare -m bash -c '
  set -e
  mount -t tmpfs none "$1"
  mount -t tmpfs none "$2"
  for lib in /usr/lib/x86_64-linux-gnu/libabsl_*.so.*; do
    if [ -f "$lib" ] && [ ! -L "$lib" ]; then mount --bind /dev/null "$lib"; fi
  done
  cd "$3"
  # Without the folder, nothing on this machine has that libtorch now.
  if ./moved/bin/service record --out none.safetensors --torch-release "$4" > none.txt 2>&1; then
    echo "relocated: FAIL: the plugin loaded with its libtorch hidden"; exit 1
  fi
  grep -q "does not load" none.txt || { cat none.txt; exit 1; }
  ./moved/bin/service record --out golden.safetensors --torch-release "$4" \
    --torch-library-dir "$3/torch/lib"
  ./moved/bin/service compare --golden golden.safetensors --torch-release "$4" \
    --torch-library-dir "$3/torch/lib"
' relocated "$build" "$(dirname "$torch_lib")" "$work" "$release"
echo "relocated: the copied install ran with the build tree and libtorch $release's folder hidden"
