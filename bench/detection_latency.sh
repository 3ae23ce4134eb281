#!/usr/bin/env bash
# Live detection latency: for each train_loop bug class, an N-rank sim job under `ncclwatch run`
# (the collector aborts what it diagnoses, so every job ends); prints the first verdict's kind,
# culprit and how long after the divergent call the collector printed it. Time-based verdicts
# (missing, stuck, dead_rank, deadlock) wait for the collector's quiet threshold (3 s) first:
# the table says so.
# Usage: bench/detection_latency.sh [BUILD_DIR] [RANKS...]   (default ranks: 8 32)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
sizes=("$@")
((${#sizes[@]})) || sizes=(8 32)
cli="$PWD/$build/bin/ncclwatch"
loop="$PWD/$build/examples/train_loop"
for f in "$cli" "$loop" "$build/lib/libncclwatch.so"; do
  [ -e "$f" ] || { echo "detection_latency.sh: $f is missing; build first" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH="$PWD/$build/sim/lib"

printf '%-6s %-7s %-14s %-8s %s\n' ranks bug verdict culprit "reported after the divergent call"
for ranks in "${sizes[@]}"; do
  # "stall": no train_loop bug but the sim's stall fault (rank 3's call #8 on the world never
  # completes on its stream): a stuck transfer, said once the job has been quiet for 3 s.
  for bug in skip op count dtype root extra peer color order exit crash stall; do
    dir="$work/$ranks-$bug"
    # A rank that exits or crashes is noticed by the launcher, which stops the job at once;
    # --keep-going leaves the rest blocked, so that the collector's verdict is what ends it.
    keep=()
    [[ $bug == exit || $bug == crash ]] && keep=(--keep-going)
    args=(--steps 8 --quiet --bug "$bug:rank=3,step=5")
    fault=
    [[ $bug == stall ]] && args=(--steps 8 --quiet) && fault="stall:rank=3,seq=8"
    out=$(NCCLSIM_FAULT=$fault timeout 120 "$cli" run --abort --dir "$dir" -- \
      "$cli" launch "${keep[@]}" -n "$ranks" -- "$loop" "${args[@]}" 2>&1 || true)
    verdict=$(printf '%s\n' "$out" | sed -n 's/^\[ncclwatch\] \([A-Z0-9_]*\) on comm.*/\1/p' | head -1)
    culprit=$(printf '%s\n' "$out" | sed -n 's/.*culprits\{0,1\} \([0-9,-]*\);.*/\1/p' | head -1)
    after=$(printf '%s\n' "$out" | sed -n 's/.*(reported \([0-9]*\) ms after the divergent call).*/\1 ms/p' | head -1)
    printf '%-6s %-7s %-14s %-8s %s\n' "$ranks" "$bug" "${verdict:-none}" "${culprit:--}" "${after:-?}"
  done
done
