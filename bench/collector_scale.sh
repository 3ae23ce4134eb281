#!/usr/bin/env bash
# Collector scale: `ncclwatch collect` fed by collector_load, which speaks the agent protocol as
# AGENTS ranks (default 4096) making 100 NCCL calls a second each, one RECORDS frame per rank
# every 100 ms. Prints the collector's CPU (cores) and RSS over a 20 s steady window, the
# generator's and the whole machine's CPU (so that a saturated machine is not read as a slow
# collector), and how long a mismatched allreduce injected afterwards takes to be reported.
# Extra arguments go to collector_load (--rate, --seconds, --tick-ms, --comm-size, --warmup,
# --verdict-wait).
# Usage: bench/collector_scale.sh [BUILD_DIR] [AGENTS] [collector_load options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
agents=${2:-4096}
shift $(($# < 2 ? $# : 2))
cli="$PWD/$build/bin/ncclwatch"
load="$PWD/$build/bench/collector_load"
for f in "$cli" "$load"; do
  [ -x "$f" ] || { echo "collector_scale.sh: $f is missing; build first (ninja -C $build ncclwatch collector_load)" >&2; exit 2; }
done
exec "$load" --cli "$cli" --agents "$agents" "$@"
