#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, build, the PyTorch venv, every ctest test,
# then the unit and sim tests labelled `sanitize` under ASan+UBSan and under TSan.
# NCCLWATCH_SANITIZERS=0 skips the sanitizer builds (quicker local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${NCCLWATCH_TEST_JOBS:-2}
# Each phase says how long it took: CI's budget is 30 minutes, and these lines say where it goes.
phase_start=$SECONDS
phase() {
  echo "[test] $1: $((SECONDS - phase_start)) s, $(df -h --output=avail . | tail -1 | tr -d ' ') free on disk"
  phase_start=$SECONDS
}
# Each ctest run gets its own TMPDIR, removed when the run passes: the tests' traces, logs and
# rendezvous files come to several GB a run, and a CI disk once filled up with them. A failing
# run's folder stays, and the last line says where.
run_ctest() {
  local build_dir=$1
  shift
  local scratch
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/ncclwatch-ctest-XXXXXX")
  if TMPDIR=$scratch ctest --test-dir "$build_dir" "$@" -j "$jobs" --output-on-failure \
      --timeout 600; then
    rm -rf "$scratch"
  else
    echo "[test] ctest in $build_dir failed; its tests' files are kept in $scratch"
    return 1
  fi
}

scripts/setup.sh build
phase "set-up and build"
# PyPI's PyTorch for the tests labelled `torch` (unmodified PyTorch on the sim); without PyPI
# they are skipped, each saying why.
scripts/torch_venv.sh build/torch-venv || echo "[test] no PyTorch venv: the torch tests will be skipped"
phase "PyTorch venv"
run_ctest build
phase "ctest"

if [ "${NCCLWATCH_SANITIZERS:-1}" != 0 ]; then
  # The two sanitizer trees take about 3 GB and their tests up to 1 GB more; the PyTorch venv
  # (5 GB) is not needed for them. On a disk that is short of that, it goes (the next run of this
  # script installs it again), saying so, rather than the build failing half-way.
  free_kib=$(df -k --output=avail . | tail -1 | tr -d ' ')
  if [ "$free_kib" -lt $((8 * 1024 * 1024)) ] && [ -d build/torch-venv ]; then
    echo "[test] $((free_kib / 1024)) MiB free on disk: removing build/torch-venv (5 GB) for the sanitizer builds"
    rm -rf build/torch-venv
  fi
  for san in address thread; do
    scripts/setup.sh "build-$san" -DNCCLWATCH_SANITIZE=$san -DCMAKE_BUILD_TYPE=Debug
    phase "$san build"
    run_ctest "build-$san" -L sanitize
    phase "$san ctest"
  done
fi
