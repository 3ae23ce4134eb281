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
  echo "[test] $1: $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}

scripts/setup.sh build
phase "set-up and build"
# PyPI's PyTorch for the tests labelled `torch` (unmodified PyTorch on the sim); without PyPI
# they are skipped, each saying why.
scripts/torch_venv.sh build/torch-venv || echo "[test] no PyTorch venv: the torch tests will be skipped"
phase "PyTorch venv"
ctest --test-dir build -j "$jobs" --output-on-failure --timeout 600
phase "ctest"

if [ "${NCCLWATCH_SANITIZERS:-1}" != 0 ]; then
  for san in address thread; do
    scripts/setup.sh "build-$san" -DNCCLWATCH_SANITIZE=$san -DCMAKE_BUILD_TYPE=Debug
    phase "$san build"
    ctest --test-dir "build-$san" -L sanitize -j "$jobs" --output-on-failure --timeout 600
    phase "$san ctest"
  done
fi
