#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, build, the PyTorch venv, every ctest test,
# then the unit and sim tests labelled `sanitize` under ASan+UBSan and under TSan.
# NCCLWATCH_SANITIZERS=0 skips the sanitizer builds (quicker local runs); NCCLWATCH_TEST_OVERLAP=0
# builds each sanitizer tree after the ctest run before it instead of beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${NCCLWATCH_TEST_JOBS:-2}
# Each phase says how long it took: CI's budget is 30 minutes, and these lines say where it goes
# (docs/ci.md). Phases that ran beside another say so.
phase_start=$SECONDS
phase() {
  echo "[test] $1: $((SECONDS - phase_start)) s, $(df -h --output=avail . | tail -1 | tr -d ' ') free on disk"
  phase_start=$SECONDS
}
# Each ctest run gets its own TMPDIR, removed when the run passes: the tests' traces, logs and
# rendezvous files come to several GB a run, and a CI disk once filled up with them. A failing
# run's folder stays, and the last line says where.
# A test that fails gets one more run, by itself after the others (ctest --rerun-failed), and
# fails the suite only if it fails again: on a loaded two-core machine with sanitizers, a
# multi-process test now and then misses a bound that it meets unloaded, and one such miss in
# ~600 tests refused three stops in a row (docs/ci.md). The first failure's output stays in the
# log, and a "[test] flaky:" line names every test that passed only on its rerun.
run_ctest() {
  local build_dir=$1
  shift
  local scratch
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/ncclwatch-ctest-XXXXXX")
  touch "$scratch/.started"
  if TMPDIR=$scratch ctest --test-dir "$build_dir" "$@" -j "${ctest_jobs:-$jobs}" --output-on-failure \
      --timeout 600; then
    rm -rf "$scratch"
    return 0
  fi
  # Only this run's list of failed tests (ctest leaves an older one in place): a run that
  # failed without one (no tests found, a broken tree) is not rerun.
  local failed="" list="$build_dir/Testing/Temporary/LastTestsFailed.log"
  if [ "$list" -nt "$scratch/.started" ]; then
    failed=$(sed 's/^[0-9]*://' "$list" | tr '\n' ' ')
    failed=${failed% }
  fi
  if [ -z "$failed" ]; then
    echo "[test] ctest in $build_dir failed, naming no failed test; its tests' files are kept in $scratch"
    return 1
  fi
  echo "[test] ctest in $build_dir: $failed failed; rerunning them once, by themselves"
  if TMPDIR=$scratch ctest --test-dir "$build_dir" "$@" --rerun-failed --output-on-failure \
      --timeout 600; then
    echo "[test] flaky: $failed failed once in $build_dir and passed on the rerun"
    rm -rf "$scratch"
  else
    echo "[test] ctest in $build_dir failed twice; its tests' files are kept in $scratch"
    return 1
  fi
}
# A command in the background, in a process group of its own (killed if this script stops
# first), its output kept in a file until finish_background prints it.
background_pid=""
background_log=""
background_name=""
background_start=0
start_background() {
  background_name=$1
  shift
  background_log=$(mktemp "${TMPDIR:-/tmp}/ncclwatch-test-XXXXXX")
  background_start=$SECONDS
  setsid "$@" >"$background_log" 2>&1 &
  background_pid=$!
}
finish_background() {
  local status=0
  wait "$background_pid" || status=$?
  background_pid=""
  cat "$background_log"
  rm -f "$background_log"
  echo "[test] ($background_name: $((SECONDS - background_start)) s from its start)"
  return "$status"
}
trap '[ -z "$background_pid" ] || { kill -- -"$background_pid" 2>/dev/null; rm -f "$background_log"; }' EXIT
# Builds started beside a ctest run get the idle scheduling class (SCHED_IDLE): they take only
# the CPU time that the tests leave unused (the multi-process tests spend much of theirs waiting
# on each other, on hangs and on timeouts), and yield it at once whenever a test wants it.
idle=(chrt --idle 0)
chrt --idle 0 true 2>/dev/null || idle=(nice -n 19)
# A sanitizer tree builds only what `ctest -L sanitize` runs (tests/CMakeLists.txt:
# sanitize_tests).
sanitizer_build=(env NCCLWATCH_BUILD_TARGET=sanitize_tests scripts/setup.sh)

# PyPI's PyTorch for the tests labelled `torch` (unmodified PyTorch on the sim); without PyPI
# they are skipped, each saying why. Its download and unpacking (about a minute) run beside the
# build, which is CPU-bound.
start_background "PyTorch venv" scripts/torch_venv.sh build/torch-venv
scripts/setup.sh build
phase "set-up and build"
finish_background || echo "[test] no PyTorch venv: the torch tests will be skipped"
phase "PyTorch venv (the rest after the build)"

sanitizers=0
[ "${NCCLWATCH_SANITIZERS:-1}" != 0 ] && sanitizers=1
# The two sanitizer trees take about 2 GB and their tests up to 1 GB more, the release tests
# several GB. With room for all of that, each sanitizer tree builds beside the ctest run before
# it (the ASan tree beside the release tests, the TSan tree beside the ASan tests); otherwise one
# thing at a time, as below.
free_kib=$(df -k --output=avail . | tail -1 | tr -d ' ')
overlap=0
[ "$sanitizers" = 1 ] && [ "${NCCLWATCH_TEST_OVERLAP:-1}" != 0 ] &&
  [ "$free_kib" -ge $((16 * 1024 * 1024)) ] && overlap=1

if [ "$overlap" = 1 ]; then
  start_background "address build" "${idle[@]}" "${sanitizer_build[@]}" build-address \
    -DNCCLWATCH_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug
  run_ctest build
  phase "ctest (the address build beside it)"
  finish_background
  phase "address build (the rest after the ctest)"
  start_background "thread build" "${idle[@]}" "${sanitizer_build[@]}" build-thread \
    -DNCCLWATCH_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug
  run_ctest build-address -L sanitize
  phase "address ctest (the thread build beside it)"
  finish_background
  phase "thread build (the rest after the address ctest)"
  # The last run has no build beside it to take the CPU its tests leave while they wait on each
  # other, on hangs and on timeouts (46% of two cores used with 2 at a time): one more at a time
  # (a 2-core machine: 156 -> 109 s, docs/ci.md).
  ctest_jobs=$((jobs + 1)) run_ctest build-thread -L sanitize
  phase "thread ctest"
  exit 0
fi

run_ctest build
phase "ctest"
if [ "$sanitizers" = 1 ]; then
  # The PyTorch venv (5 GB) is not needed for the sanitizer tests. On a disk that is short of
  # room for them, it goes (the next run of this script installs it again), saying so, rather
  # than the build failing half-way.
  free_kib=$(df -k --output=avail . | tail -1 | tr -d ' ')
  if [ "$free_kib" -lt $((8 * 1024 * 1024)) ] && [ -d build/torch-venv ]; then
    echo "[test] $((free_kib / 1024)) MiB free on disk: removing build/torch-venv (5 GB) for the sanitizer builds"
    rm -rf build/torch-venv
  fi
  for san in address thread; do
    "${sanitizer_build[@]}" "build-$san" -DNCCLWATCH_SANITIZE=$san -DCMAKE_BUILD_TYPE=Debug
    phase "$san build"
    run_ctest "build-$san" -L sanitize
    phase "$san ctest"
  done
fi
