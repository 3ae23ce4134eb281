#!/usr/bin/env bash
# The demo, from a fresh machine: set-up and build, then `ncclwatch demo`: 8 ranks of
# examples/train_loop on the GPU-less sim with an injected bug (rank 3 skips an allreduce at step
# 5), the watchdogs' live verdicts, the cross-rank diagnosis, a Perfetto timeline and an HTML
# report. Arguments go to `ncclwatch demo` (--bug KIND, --ranks N, --dir DIR; see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build >/dev/null
exec build/bin/ncclwatch demo "$@"
