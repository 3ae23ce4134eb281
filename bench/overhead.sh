#!/usr/bin/env bash
# Host time per ncclAllReduce with and without libncclwatch.so, measured in one run on the sim's
# instant mode: without ncclwatch, with it recording only (events off), and with completion
# events. Runs are interleaved (the three configurations, repeated) and the median of each
# configuration's medians is reported, so that machine noise hits all alike.
# Usage: bench/overhead.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
loop="$build/bench/overhead_loop"
preload="$PWD/$build/lib/libncclwatch.so"
cli="$build/bin/ncclwatch"
for f in "$loop" "$preload" "$cli" "$build/sim/lib/libnccl.so.2"; do
  [ -e "$f" ] || { echo "overhead.sh: $f is missing; build first (scripts/setup.sh $build)" >&2; exit 2; }
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# 400 batches of 200 calls; a 3 ms pause after each batch (untimed) lets the watchdog, polling
# every 2 ms here, hand the batch's event pairs back, as a training step's compute would.
run() {  # NAME [env assignments...]
  local name=$1; shift
  env LD_LIBRARY_PATH="$PWD/$build/sim/lib" NCCLSIM_INSTANT=1 NCCLWATCH_DIR="$logs/$name" \
    NCCLWATCH_POLL_MS=2 "$@" "$loop" 400 200 3000 |
    sed -n 's/.*median_ns=\([0-9.]*\).*rss_kib=\([0-9-]*\).*/\1 \2/p' >>"$logs/$name.txt"
}
for ((i = 0; i < rounds; i++)); do
  run base
  run recording LD_PRELOAD="$preload" NCCLWATCH_EVENTS=0
  run events LD_PRELOAD="$preload" NCCLWATCH_EVENTS=1
done

median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
base=$(cut -d' ' -f1 "$logs/base.txt" | median)
off=$(cut -d' ' -f1 "$logs/recording.txt" | median)
on=$(cut -d' ' -f1 "$logs/events.txt" | median)
rss_base=$(cut -d' ' -f2 "$logs/base.txt" | median)
rss_off=$(cut -d' ' -f2 "$logs/recording.txt" | median)
rss_on=$(cut -d' ' -f2 "$logs/events.txt" | median)
ring=$(find "$logs/recording" -name '*.ncclwatch' -printf '%s\n' 2>/dev/null | head -1)
# How many of the calls that the events run's ring still holds got completion events: a figure
# for the events row is only a figure for events if (nearly) all did.
trace=$(find "$logs/events" -name '*.ncclwatch' | head -1)
tracked=$("$cli" show --json "$trace" | python3 -c '
import json, sys
records = [r for r in json.load(sys.stdin)["records"] if r["op"] == "AllReduce"]
done = sum(1 for r in records if not r["no_events"] and r["state"] == "completed")
print(f"{done} of {len(records)}")')

printf 'ncclAllReduce host time per call, sim instant mode, median of %d runs x 80k calls\n' "$rounds"
printf '  %-36s %8.1f ns\n' "without ncclwatch" "$base"
printf '  %-36s %8.1f ns  (+%.1f ns, budget 50)\n' "with ncclwatch, recording only" "$off" "$(awk "BEGIN{print $off - $base}")"
printf '  %-36s %8.1f ns  (+%.1f ns, budget 600)\n' "with ncclwatch, completion events" "$on" "$(awk "BEGIN{print $on - $base}")"
printf '  calls tracked to completion in the events run (last ring): %s\n' "$tracked"
printf '  resident memory: %s KiB without, %s KiB recording (+%s), %s KiB with events (+%s)\n' \
  "$rss_base" "$rss_off" "$((rss_off - rss_base))" "$rss_on" "$((rss_on - rss_base))"
printf '  ring: %s bytes per record; ring file %s bytes\n' 128 "$ring"
exit 0
