#!/usr/bin/env bash
# keel's GPU check, in one run of at most 8 minutes and without a network:
# configures keel against the CUDA torch of this machine's python3, builds it
# with KEEL_WITH_CUDA=ON, runs the CUDA conformance suite, then the
# benchmarks (tests/bench/gpu_bench.cpp for keel and SDPA, tests/bench/
# flex_bench.py for FlexAttention), and writes every result into one JSON and
# one log: $OUT (or --out DIR; default build/gpu-check)/gpu-check.{json,log}.
#
#   scripts/gpu-check.sh [--out DIR] [--debs DIR] [--build DIR]   # on a GPU machine
#   scripts/gpu-check.sh --dry-run [--out DIR]    # anywhere: all that needs no GPU
#   scripts/gpu-check.sh --prepare-debs DIR       # with a network: fetch what it carries
#
# Its three parts: the install (scripts/gpu-check-install.sh, reading the one
# Debian package list, scripts/debian-packages.txt), the run (this script:
# torch, configure, build, the CUDA suite and the benchmarks, each a bounded
# step), and the summary (scripts/gpu_summary.py, whose goals are data).
#
# What it expects to find (it fetches nothing):
#   - an NVIDIA GPU and its driver (libcuda.so.1); nvidia-smi is read if present;
#   - python3 with a CUDA build of torch >= 2.9 (2.9 <= v < 2.13 is served by
#     keel's compat adapter, >= 2.13 adds the native one), e.g. torch 2.11 with
#     CUDA 13, with its nvidia-* wheels beside it (site-packages/nvidia/*:
#     their headers and libraries serve, so no CUDA toolkit is needed);
#   - a C++17 compiler (g++ >= 11 or clang++ >= 14), CMake >= 3.25, ninja
#     (else make), readelf and nm (binutils);
#   - the headers keel builds with, the Debian packages tagged "gpu" in
#     scripts/debian-packages.txt. Missing ones are installed from the .deb
#     files in --debs DIR (default build/gpu-check-debs), which
#     `--prepare-debs DIR` fills on a Debian 12 machine with `apt-get
#     download`, together with the PyPI wheels of cmake and ninja for a
#     machine whose CMake is older than 3.25.
# Doxygen is not needed: the docs test is not run here.
#
# --dry-run builds against the newest supported libtorch from
# scripts/fetch-deps.sh (~/.cache/keel/libtorch-<newest>, a CUDA build) with
# the machine's CUDA toolkit, in build/torch-<newest>-cuda (the CI preset's
# tree, so it is incremental), checks the Python side parses, merges the JSON, and reports
# that no GPU is present. It exits 0 when all of that worked.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=releases.sh
source scripts/releases.sh

mode=run
out=${OUT:-$root/build/gpu-check}
debs=$root/build/gpu-check-debs
build=
torch_dir=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) mode=dry-run ;;
    --prepare-debs) mode=prepare; debs=${2:?--prepare-debs needs a directory}; shift ;;
    --out) out=${2:?}; shift ;;
    --debs) debs=${2:?}; shift ;;
    --build) build=${2:?}; shift ;;
    --torch-dir) torch_dir=${2:?}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$mode" = prepare ]; then
  exec scripts/gpu-check-install.sh --prepare "$debs"
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/gpu-check.log
: > "$log"
exec > >(tee -a "$log") 2>&1
start=$SECONDS
budget=480
steps_file=$out/steps.jsonl
: > "$steps_file"

say() { echo "gpu-check [$((SECONDS - start))s]: $*"; }
left() { echo $((budget - (SECONDS - start))); }
# step NAME SECONDS COMMAND...: runs COMMAND under a time limit (capped by
# what is left of the budget) and records its status and time.
step() {
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  local remaining
  remaining=$(left)
  [ "$limit" -le "$remaining" ] || limit=$remaining
  if [ "$limit" -le 0 ]; then
    say "$name: skipped, the 8-minute budget is spent"
    printf '{"step": "%s", "status": "skipped", "rc": null, "seconds": 0}\n' "$name" >> "$steps_file"
    return 1
  fi
  say "$name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  local status=ok
  [ $rc -eq 0 ] || status=failed
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || status=timed_out
  printf '{"step": "%s", "status": "%s", "rc": %d, "seconds": %d}\n' \
    "$name" "$status" "$rc" $((SECONDS - t0)) >> "$steps_file"
  say "$name: $status (rc $rc, $((SECONDS - t0))s)"
  return $rc
}

# --- prerequisites ----------------------------------------------------------
missing_tools=()
for tool in python3 cmake c++ readelf nm timeout; do
  command -v "$tool" >/dev/null || missing_tools+=("$tool")
done
mapfile -t missing_packages < <(scripts/gpu-check-install.sh --missing)
if [ ${#missing_packages[@]} -gt 0 ]; then
  say "missing: ${missing_packages[*]}"
  if compgen -G "$debs/*.deb" >/dev/null || compgen -G "$debs/*.whl" >/dev/null; then
    say "installing the carried files from $debs (no network)"
    step install 240 scripts/gpu-check-install.sh --install "$debs" || true
    hash -r
  elif [ "$mode" != dry-run ]; then
    say "no .deb files in $debs: run 'scripts/gpu-check.sh --prepare-debs $debs' on a machine with a network"
  fi
fi
generator=Ninja
command -v ninja >/dev/null || generator="Unix Makefiles"

# --- torch -------------------------------------------------------------------
torch_json=$out/torch.json
if [ -z "$torch_dir" ] && [ "$mode" = run ]; then
  python3 - > "$torch_json" <<'EOF' || echo '{"error": "python3 cannot import torch"}' > "$torch_json"
import json, os
import torch
info = {"dir": os.path.dirname(torch.__file__), "version": torch.__version__,
        "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count()}
if info["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    info["device_name"] = p.name
    info["device_memory_bytes"] = p.total_memory
    info["capability"] = "%d.%d" % (p.major, p.minor)
print(json.dumps(info))
EOF
  torch_dir=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("dir", ""))' "$torch_json")
fi
if [ "$mode" = dry-run ]; then
  torch_dir=${torch_dir:-${KEEL_DEPS_DIR:-$HOME/.cache/keel}/libtorch-$keel_newest}
  echo "{\"dir\": \"$torch_dir\", \"note\": \"dry run: libtorch from scripts/fetch-deps.sh, not python3's torch\"}" > "$torch_json"
  build=${build:-$root/build/torch-$keel_newest-cuda}
fi
build=${build:-$out/build}
gpu_present=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1; then
  gpu_present=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/nvidia-smi.txt" 2>&1 || true
elif [ "$mode" = run ] && grep -q '"cuda_available": true' "$torch_json"; then
  gpu_present=1
fi
say "torch at ${torch_dir:-?}; GPU present: $gpu_present; generator: $generator"

ok=1
if [ ${#missing_tools[@]} -gt 0 ]; then
  say "missing tools: ${missing_tools[*]}"
  ok=0
fi
mapfile -t still_missing < <(scripts/gpu-check-install.sh --missing | grep -vx ninja-build || true)
if [ ${#still_missing[@]} -gt 0 ]; then
  say "still missing: ${still_missing[*]}"
  ok=0
fi
[ -n "$torch_dir" ] && [ -d "$torch_dir/include" ] || { say "no torch with include/ at '${torch_dir}'"; ok=0; }
printf '{"step": "prerequisites", "status": "%s", "rc": %d, "seconds": %d}\n' \
  "$([ $ok -eq 1 ] && echo ok || echo failed)" $((1 - ok)) $((SECONDS - start)) >> "$steps_file"

# --- configure and build -----------------------------------------------------
jobs=$(nproc)
nice_cmd=()
if [ "$mode" = dry-run ]; then
  nice_cmd=(nice -n 10)
  jobs=2
fi
configure_args=(-S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release
  -DKEEL_TORCH_DIR="$torch_dir" -DKEEL_WITH_CUDA=ON)
command -v doxygen >/dev/null || configure_args+=(-DKEEL_DOXYGEN=/bin/true)
built=0
if [ $ok -eq 1 ] && step configure 90 cmake "${configure_args[@]}" &&
   step build 300 "${nice_cmd[@]}" cmake --build "$build" --target keel_tests keel_gpu_bench \
     --parallel "$jobs"; then
  built=1
fi

# --- the checks that need a GPU ---------------------------------------------
if [ "$mode" = dry-run ]; then
  step flex-script-check 30 python3 "$root/tests/bench/flex_bench.py" --check || true
  if [ $built -eq 1 ]; then
    # Without a GPU the CUDA suite must skip, saying why; but the binaries
    # load only where every library libtorch_cuda.so names is (this
    # machine's toolkit lacks cuSPARSELt, NVSHMEM and cuFile).
    unresolved=$(ldd "$build/tests/keel_tests" | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
    if [ -z "$unresolved" ]; then
      step conformance-cuda-skips 120 "$build/tests/keel_tests" --gtest_filter='*CudaConformance.*' \
        --gtest_output="json:$out/conformance-cuda.json" || true
    else
      say "keel_tests and keel_gpu_bench are built but do not load here (missing: $unresolved)"
      printf '{"step": "load-check", "status": "not_loadable_here", "rc": null, "seconds": 0, "missing": "%s"}\n' \
        "$unresolved" >> "$steps_file"
    fi
  fi
  say "dry run: no GPU here, so the CUDA suite skips and the benchmarks are not run"
elif [ $built -eq 1 ] && [ $gpu_present -eq 1 ]; then
  step conformance-cuda 150 "$build/tests/keel_tests" --gtest_filter='*CudaConformance.*' \
    --gtest_output="json:$out/conformance-cuda.json" || true
  step gpu-bench 150 "$build/tests/keel_gpu_bench" --out "$out/gpu-bench.json" || true
  step flex-bench 120 python3 "$root/tests/bench/flex_bench.py" --out "$out/flex.json" || true
elif [ $gpu_present -eq 0 ]; then
  say "no GPU found (nvidia-smi -L and torch.cuda.is_available()): nothing to run on CUDA"
fi

# --- one JSON ------------------------------------------------------------------
python3 scripts/gpu_summary.py "$out" "$mode" "$gpu_present" "$((SECONDS - start))" "$budget"
say "wrote $out/gpu-check.json and $log"
status=0
grep -q '"status": "\(failed\|timed_out\|skipped\)"' "$steps_file" && status=1
if [ "$mode" = run ] && [ $gpu_present -eq 0 ]; then status=1; fi
exit $status
