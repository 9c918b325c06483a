#!/usr/bin/env bash
# The C ABI's promise, kept by CI: a service built against 1.0 runs on every
# later plugin of major 1 (docs/c-api.md, "The guard").
#
# Takes the C headers, the loader and the example service of the commit that
# froze 1.0 (abi/c-abi-1.0.commit) out of git (no binary in the repository),
# builds them with warnings only, and runs that service against each plugin
# given: it records every case on the first plugin and replays them on each
# other one (keel::compat's tolerance policy), and runs its comm checks on 2
# ranks on each.
#
#   scripts/abi-1.0-consumer.sh DLPACK_INCLUDE_DIR PLUGIN [PLUGIN...]
set -euo pipefail
cd "$(dirname "$0")/.."
dlpack=$(cd "${1:?usage: scripts/abi-1.0-consumer.sh DLPACK_INCLUDE_DIR PLUGIN...}" && pwd)
shift
[ $# -ge 1 ] || { echo "usage: scripts/abi-1.0-consumer.sh DLPACK_INCLUDE_DIR PLUGIN..."; exit 2; }
commit=$(tr -d '[:space:]' < abi/c-abi-1.0.commit)
git cat-file -e "$commit^{commit}" 2>/dev/null ||
  { echo "abi-1.0-consumer: commit $commit (abi/c-abi-1.0.commit) is not in this clone"; exit 1; }
work=build/abi-1.0
rm -rf "$work"
mkdir -p "$work/src" "$work/bin"
git archive "$commit" include/keel/c examples/c_consumer c_api/loader cmake/libkeel_loader.map |
  tar -x -C "$work/src"
cc -std=c11 -O2 -fPIC -shared -Wall -Wextra -Wpedantic -Werror -I "$work/src/include" -I "$dlpack" \
  "$work/src/c_api/loader/loader.c" -Wl,-soname,libkeel_loader.so.1 \
  -Wl,--version-script="$work/src/cmake/libkeel_loader.map" -ldl -o "$work/bin/libkeel_loader.so.1"
ln -sf libkeel_loader.so.1 "$work/bin/libkeel_loader.so"
c++ -std=c++17 -O2 -Wall -Wextra -Wpedantic -Werror -I "$work/src/include" -I "$dlpack" \
  "$work/src/examples/c_consumer/consumer.cpp" -L "$work/bin" -lkeel_loader \
  -Wl,-rpath,'$ORIGIN' -o "$work/bin/consumer"
consumer=$work/bin/consumer
echo "keel: ===== the C ABI 1.0 consumer (commit ${commit:0:12}), sha256 $(sha256sum "$consumer" | cut -d' ' -f1) ====="
golden=$work/golden.safetensors
"$consumer" record --out "$golden" --plugin "$1"
for plugin in "$@"; do
  "$consumer" compare --golden "$golden" --plugin "$plugin"
  scripts/c-consumer-comm.sh "$consumer" --plugin "$plugin"
done
echo "keel: the C ABI 1.0 consumer ran on $# plugins"
