#!/usr/bin/env bash
# The demo, from a fresh machine: set-up, build, then 8 ranks of examples/train_loop on the
# GPU-less sim, each step's results verified.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build >/dev/null
export LD_LIBRARY_PATH="$PWD/build/sim/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec build/bin/ncclwatch launch -n "${RANKS:-8}" -- build/examples/train_loop --steps "${STEPS:-10}" "$@"
