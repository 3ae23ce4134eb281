#!/usr/bin/env bash
# Installs what ncclwatch needs on a fresh Debian 12 machine of this kind, then configures and
# builds. Usage: scripts/setup.sh [BUILD_DIR] [extra cmake args...]
# NCCLWATCH_BUILD_TARGET=NAME builds only that target (scripts/test.sh: sanitize_tests).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true

packages=(cmake ninja-build g++ clang libclang-rt-14-dev googletest libgtest-dev libgmock-dev
  libbenchmark-dev libunwind-14-dev libabsl-dev libsimdjson-dev libcli11-dev
  libdw-dev  # libdwfl: stacks-of (ptrace stacks), file:line of dump frames offline
  chromium  # chromium: headless rendering of `ncclwatch report` pages in tests
  openmpi-bin)  # mpirun, for the launcher tests
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# FindCUDAToolkit locates the toolkit next to nvcc.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# PyPI's newer real NCCL (2.32): what its profiler loader probes, and its nccl.h.
scripts/nccl_wheel.sh "$build_dir/nccl-wheel"

if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja "$@"
fi
cmake --build "$build_dir" ${NCCLWATCH_BUILD_TARGET:+--target "$NCCLWATCH_BUILD_TARGET"}
