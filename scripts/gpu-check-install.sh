#!/usr/bin/env bash
# The GPU check's install step: what its build needs beyond a compiler, a
# CUDA torch and python3 — the Debian packages tagged "gpu" in
# scripts/debian-packages.txt, and CMake >= 3.25 — carried as files to a
# machine without a network.
#
#   scripts/gpu-check-install.sh --prepare DIR   # Debian 12 with a network: the .deb
#                                                # files (and their libraries, one level)
#                                                # and the cmake and ninja wheels, into DIR
#   scripts/gpu-check-install.sh --missing       # what is missing, one per line ("cmake"
#                                                # for a CMake older than 3.25); exit 0
#   scripts/gpu-check-install.sh --install DIR   # no network: installs what is missing
#                                                # from DIR; exit 1 if anything still is
set -euo pipefail
list=$(cd "$(dirname "$0")" && pwd)/debian-packages.txt
mode=${1:-}
dir=${2:-}

missing() {
  awk '!/^#/ && $2 == "gpu" {print $1, $3}' "$list" | while read -r package header; do
    [ -e "$header" ] || echo "$package"
  done
  local version
  version=$(cmake --version 2>/dev/null | sed -n 's/cmake version \([0-9.]*\).*/\1/p')
  if [ -z "$version" ] || [ "$(printf '3.25\n%s\n' "$version" | sort -V | head -n1)" != 3.25 ]; then
    echo cmake
  fi
}

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

case $mode in
  --missing)
    missing
    ;;
  --prepare)
    [ -n "$dir" ] || { echo "usage: $0 --prepare DIR" >&2; exit 2; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    mapfile -t packages < <(awk '!/^#/ && $2 == "gpu" {print $1}' "$list")
    [ -n "$(find /var/lib/apt/lists -name '*Packages*' -print -quit 2>/dev/null)" ] || $sudo_cmd apt-get update -qq
    # The packages and the libraries they depend on (one level: the -dev
    # packages' runtime libraries), less what every Debian or Ubuntu has.
    want=("${packages[@]}")
    for p in "${packages[@]}"; do
      while read -r d; do want+=("$d"); done < <(apt-cache depends --no-recommends --no-suggests \
        --no-conflicts --no-breaks --no-replaces --no-enhances "$p" |
        awk '$1 == "Depends:" && $2 !~ /^</ {print $2}' |
        grep -v -E '^(libc6|libstdc\+\+6|libgcc-s1|zlib1g)$' || true)
    done
    mapfile -t want < <(printf '%s\n' "${want[@]}" | sort -u)
    echo "gpu-check-install: downloading ${#want[@]} packages into $dir: ${want[*]}"
    (cd "$dir" && apt-get download "${want[@]}")
    python3 -m pip download --quiet --only-binary=:all: --no-deps -d "$dir" 'cmake>=3.25,<4' ninja
    du -sh "$dir"
    ;;
  --install)
    [ -d "$dir" ] || { echo "gpu-check-install: no directory '$dir' of carried files" >&2; exit 2; }
    dir=$(cd "$dir" && pwd)  # apt takes a .deb by path only with a slash in front
    mapfile -t need < <(missing)
    [ ${#need[@]} -gt 0 ] || { echo "gpu-check-install: nothing is missing"; exit 0; }
    echo "gpu-check-install: missing ${need[*]}"
    if [ "${need[*]}" != cmake ] && ls "$dir"/*.deb >/dev/null 2>&1; then
      # apt resolves the files among themselves and the installed packages.
      $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-download \
        --no-install-recommends "$dir"/*.deb || $sudo_cmd dpkg -i --skip-same-version "$dir"/*.deb || true
    fi
    if printf '%s\n' "${need[@]}" | grep -qx cmake && ls "$dir"/cmake-*.whl >/dev/null 2>&1; then
      python3 -m pip install --quiet --no-index --find-links "$dir" cmake ninja || true
    fi
    hash -r
    mapfile -t still < <(missing)
    [ ${#still[@]} -eq 0 ] || { echo "gpu-check-install: still missing ${still[*]}"; exit 1; }
    echo "gpu-check-install: everything is installed"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d'
    [ "$mode" = -h ] || [ "$mode" = --help ] || exit 2
    ;;
esac
