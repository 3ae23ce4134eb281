#!/usr/bin/env bash
# Host time per ncclAllReduce with and without libncclwatch.so, measured in one run on the sim's
# instant mode. Runs are interleaved (without, with ncclwatch, repeated) and the median of
# each configuration's medians is reported, so that machine noise hits both alike.
# Usage: bench/overhead.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
loop="$build/bench/overhead_loop"
preload="$PWD/$build/lib/libncclwatch.so"
for f in "$loop" "$preload" "$build/sim/lib/libnccl.so.2"; do
  [ -e "$f" ] || { echo "overhead.sh: $f is missing; build first (scripts/setup.sh $build)" >&2; exit 2; }
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

run() {  # NAME [env assignments...]
  local name=$1; shift
  env LD_LIBRARY_PATH="$PWD/$build/sim/lib" NCCLSIM_INSTANT=1 NCCLWATCH_DIR="$logs/$name" "$@" \
    "$loop" 200 1000 | sed -n 's/.*median_ns=\([0-9.]*\).*rss_kib=\([0-9-]*\).*/\1 \2/p' >>"$logs/$name.txt"
}
for ((i = 0; i < rounds; i++)); do
  run base
  run recording LD_PRELOAD="$preload" NCCLWATCH_EVENTS=0
done

median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
base=$(cut -d' ' -f1 "$logs/base.txt" | median)
off=$(cut -d' ' -f1 "$logs/recording.txt" | median)
rss_base=$(cut -d' ' -f2 "$logs/base.txt" | median)
rss_on=$(cut -d' ' -f2 "$logs/recording.txt" | median)
ring=$(find "$logs/recording" -name '*.ncclwatch' -printf '%s\n' 2>/dev/null | head -1)

printf 'ncclAllReduce host time per call, sim instant mode, median of %d runs x 200k calls\n' "$rounds"
printf '  %-34s %8.1f ns\n' "without ncclwatch" "$base"
printf '  %-34s %8.1f ns  (+%.1f ns, budget 50)\n' "with ncclwatch, recording only" "$off" "$(awk "BEGIN{print $off - $base}")"
# Completion events (budget 600 ns) get their own row once completion tracking lands.
printf '  resident memory: %s KiB without, %s KiB with (+%s KiB)\n' "$rss_base" "$rss_on" "$((rss_on - rss_base))"
[ -n "$ring" ] && printf '  ring file: %s bytes\n' "$ring"
exit 0
