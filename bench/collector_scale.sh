#!/usr/bin/env bash
# Collector scale: `ncclwatch collect` fed by collector_load, which speaks the agent protocol as
# AGENTS ranks (default 4096) making 100 NCCL calls a second each, one RECORDS frame per rank
# every 100 ms. Prints the collector's CPU (cores) and RSS over a 20 s steady window, the
# generator's and the whole machine's CPU (so that a saturated machine is not read as a slow
# collector), the wire bytes a second, and how long a mismatched allreduce injected afterwards
# takes to be reported.
#
# Modes (the second argument):
#   N          N ranks, each with its own connection to the collector (default 4096)
#   relays     32,768 ranks on 4,096 hosts of 8, each host's ranks multiplexed over one
#              connection as its relay does (docs/protocol.md, "Relays"; the synthetic relays
#              live in the generator): the collector sees 4,096 connections
#   relays:N:H N ranks on H hosts, through relays
# Extra arguments go to collector_load (--rate, --seconds, --tick-ms, --comm-size, --warmup,
# --verdict-wait). On a machine with few cores the generator, which encodes every rank's
# records, competes with the collector: read its "generator CPU" and "machine CPU" lines.
# Usage: bench/collector_scale.sh [BUILD_DIR] [N | relays | relays:N:H] [collector_load options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mode=${2:-4096}
shift $(($# < 2 ? $# : 2))
cli="$PWD/$build/bin/ncclwatch"
load="$PWD/$build/bench/collector_load"
for f in "$cli" "$load"; do
  [ -x "$f" ] || { echo "collector_scale.sh: $f is missing; build first (ninja -C $build ncclwatch collector_load)" >&2; exit 2; }
done
case "$mode" in
  relays) exec "$load" --cli "$cli" --agents 32768 --hosts 4096 "$@" ;;
  relays:*:*)
    IFS=: read -r _ agents hosts <<<"$mode"
    exec "$load" --cli "$cli" --agents "$agents" --hosts "$hosts" "$@" ;;
  *) exec "$load" --cli "$cli" --agents "$mode" "$@" ;;
esac
