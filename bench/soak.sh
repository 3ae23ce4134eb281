#!/usr/bin/env bash
# A long healthy job under ncclwatch, with the disturbances a real cluster has: seeded random slow
# ranks, long host pauses (one rank computes while the others wait in a collective) and short
# network stalls that recover (the sim's `pause` fault). Nothing in it is a bug, so every error
# verdict is a false alarm. Prints the false alarms, dropped records, the collector's CPU and
# peak RSS, and each rank's RSS growth over the run.
#
# Usage: bench/soak.sh [BUILD_DIR] [RANKS] [STEPS] [SEED]   (default build 64 2000 1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ranks=${2:-64}
steps=${3:-2000}
seed=${4:-1}
cli="$PWD/$build/bin/ncclwatch"
loop="$PWD/$build/examples/train_loop"
for f in "$cli" "$loop" "$build/lib/libncclwatch.so" "$build/sim/lib/libnccl.so.2"; do
  [ -e "$f" ] || { echo "soak.sh: $f is missing; build first (scripts/setup.sh $build)" >&2; exit 2; }
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The disturbances, from the seed: 3 ranks slow by 1-3 ms a call from a random step on, 6 host
# pauses of 0.5-3 s, 8 network stalls of 50-800 ms on the world communicator.
{ read -r bugs; read -r faults; } < <(python3 - "$ranks" "$steps" "$seed" <<'EOF'
import random, sys
ranks, steps, seed = map(int, sys.argv[1:])
rng = random.Random(seed)
bugs = []
for rank in rng.sample(range(ranks), min(3, ranks)):
    bugs.append(f"--bug slow:rank={rank},step={rng.randrange(steps // 2)},ms={rng.randint(1, 3)}")
for _ in range(6):
    bugs.append(f"--bug pause:rank={rng.randrange(ranks)},step={rng.randrange(1, steps)},"
                f"ms={rng.randint(500, 3000)}")
faults = [f"pause:rank={rng.randrange(ranks)},seq={rng.randrange(20, steps * 8)},"
          f"us={rng.randint(50_000, 800_000)}" for _ in range(8)]
print(" ".join(bugs))
print(";".join(faults))
EOF
)
echo "soak: $ranks ranks x $steps steps, seed $seed"
echo "  disturbances: $bugs"
echo "  network stalls: $faults"

export LD_LIBRARY_PATH="$PWD/$build/sim/lib" NCCLSIM_FAULT="$faults"
start=$(date +%s.%N)
"$cli" run --dir "$logs/run" -- "$cli" launch -n "$ranks" -- "$loop" --steps "$steps" --quiet \
  $bugs >"$logs/out.txt" 2>&1 &
run=$!

# Samples every 2 s: the collector's CPU and peak RSS (inside `ncclwatch run`), and the ranks'
# RSS (the first sample after 5 s against the last one).
rss_of() { awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
ranks_rss() { local total=0 n=0; for p in $(pgrep -f "$loop --steps $steps" || true); do
  total=$((total + $(rss_of "$p"))); n=$((n + 1)); done; echo "$total $n"; }
sleep 5
early=$(ranks_rss)
while kill -0 "$run" 2>/dev/null; do
  late=$(ranks_rss)
  [ "${late#* }" != 0 ] && last_late=$late
  cpu_ticks=$(awk '{print $14 + $15}' "/proc/$run/stat" 2>/dev/null || echo "${cpu_ticks:-0}")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$run/status" 2>/dev/null || echo "${hwm:-0}")
  sleep 2
done
wait "$run" && status=0 || status=$?
end=$(date +%s.%N)
elapsed=$(awk "BEGIN{print $end - $start}")

false_alarms=$(python3 - "$logs/run/verdicts.jsonl" <<'EOF'
import json, sys, collections
kinds = collections.Counter()
try:
    for line in open(sys.argv[1]):
        kinds[json.loads(line)["kind"]] += 1
except FileNotFoundError:
    pass
errors = {k: n for k, n in kinds.items() if k != "straggler"}
detail = ",".join(f"{k}={n}" for k, n in sorted(errors.items())) or "-"
print(sum(errors.values()), detail, kinds.get("straggler", 0))
EOF
)
dropped=$(for f in "$logs"/run/*.ncclwatch; do "$cli" show --json "$f" 2>/dev/null |
  python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["dropped_records"] + h["dropped_comms"])'; done |
  awk '{s += $1} END {print s + 0}')
ticks=$(getconf CLK_TCK)
read -r alarms alarm_kinds stragglers <<<"$false_alarms"
read -r early_kib early_n <<<"$early"
read -r late_kib late_n <<<"${last_late:-0 0}"
printf 'soak result (exit %d, %.0f s):\n' "$status" "$elapsed"
printf '  error verdicts (false alarms): %s (%s); straggler notes: %s\n' "$alarms" "$alarm_kinds" "$stragglers"
printf '  dropped records and communicators (all ranks): %s\n' "$dropped"
printf '  collector (ncclwatch run): %.2f cores on average, peak RSS %s KiB\n' \
  "$(awk "BEGIN{print ${cpu_ticks:-0} / $ticks / $elapsed}")" "${hwm:-?}"
if [ "${early_n:-0}" -gt 0 ] && [ "${late_n:-0}" -gt 0 ]; then
  printf '  rank RSS: %d KiB per rank after 5 s, %d KiB near the end (%+d KiB per rank)\n' \
    "$((early_kib / early_n))" "$((late_kib / late_n))" "$(((late_kib / late_n) - (early_kib / early_n)))"
fi
[ "$status" = 0 ] || tail -20 "$logs/out.txt"
