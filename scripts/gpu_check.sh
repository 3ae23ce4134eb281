#!/usr/bin/env bash
# The checks that need a real GPU and a real NCCL, in one short run (docs/gpu-check.md).
#   scripts/gpu_check.sh pack [BUILD_DIR] [DEST]   here: copy the built binaries (and the CLI's
#                                                  shared libraries) into DEST (default .gpu)
#   scripts/gpu_check.sh run [PREFIX] [OUT]        on the GPU machine: PREFIX is a packed folder
#                                                  (default .gpu); the log and traces go to OUT
# The GPU machine needs the CUDA 13 runtime, python3 with PyTorch and its NCCL wheel. Every step
# is bounded by `timeout` and says PASS/FAIL/INFO on one line; the run exits 0 even when a
# step fails, so that the log comes back whole.
set -uo pipefail
cd "$(dirname "$0")/.."
verb=${1:-}
if [ "$verb" = pack ]; then
  build=${2:-build}
  dest=${3:-.gpu}
  rm -rf "$dest"
  mkdir -p "$dest"/{bin,lib,examples,bench,deps}
  cp "$build/bin/ncclwatch" "$dest/bin/"
  strip --strip-debug "$dest/bin/ncclwatch"  # 37 MB of debug info; the device call carries 64 MiB
  cp "$build/lib/libncclwatch.so" "$dest/lib/"
  cp "$build"/examples/{allreduce_loop,train_loop,nccl_probe} "$dest/examples/"
  cp "$build"/bench/{overhead_loop,driver_cost,libnull_profiler_plugin.so,recording_cost,collector_load} "$dest/bench/"
  strip --strip-debug "$dest"/bench/{recording_cost,collector_load}  # 41 MB of debug info
  # recording_cost's BM_WholeCallEvents loads the stub driver from beside itself.
  mkdir -p "$dest/bench/stub_cuda" && cp "$build/bench/stub_cuda/libcuda.so.1" "$dest/bench/stub_cuda/"
  # GPU_CHECK_BASE_LIB: an older libncclwatch.so to measure beside this one (step 3).
  if [ -n "${GPU_CHECK_BASE_LIB:-}" ]; then
    mkdir -p "$dest/lib-base" && cp "$GPU_CHECK_BASE_LIB" "$dest/lib-base/"
  fi
  # GPU_CHECK_BASE_CLI: an older ncclwatch for step 6's "base:" modes (the same load generator).
  if [ -n "${GPU_CHECK_BASE_CLI:-}" ]; then
    mkdir -p "$dest/base/bin" "$dest/base/bench"
    cp "$GPU_CHECK_BASE_CLI" "$dest/base/bin/ncclwatch"
    strip --strip-debug "$dest/base/bin/ncclwatch"
    cp "$build/bench/collector_load" "$dest/base/bench/"
  fi
  # GPU_CHECK_BASE_BENCH: an older recording_cost (with BM_WholeCall) to run beside this one.
  if [ -n "${GPU_CHECK_BASE_BENCH:-}" ]; then
    cp "$GPU_CHECK_BASE_BENCH" "$dest/bench/recording_cost_base"
  fi
  # The CLI's and the benchmark's libraries that a machine without Debian's packages may lack.
  for lib in $(ldd "$build/bin/ncclwatch" "$build/bench/recording_cost" | awk '/=>/ {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libstdc++* | libgcc_s* | libz.so*) ;;
      *) cp -L "$lib" "$dest/deps/" ;;
    esac
  done
  du -sh "$dest"
  exit 0
fi
if [ "$verb" != run ]; then
  echo "usage: scripts/gpu_check.sh pack [BUILD_DIR] [DEST] | run [PREFIX] [OUT]" >&2
  exit 2
fi
prefix=$(realpath "${2:-.gpu}")
out=$(realpath -m "${3:-/tmp/gpu_check}")
mkdir -p "$out"
cli="$prefix/bin/ncclwatch"
preload="$prefix/lib/libncclwatch.so"
say() { echo "[gpu_check] $*"; }
# GPU_CHECK_STEPS: which steps to run (default 1 2 3 4 5; on request: 6, the collector at scale;
# 7, an abort behind PyTorch's back; 8, a rank that never reaches NCCL's init);
# GPU_CHECK_ROUNDS: step 3's rounds.
steps=" ${GPU_CHECK_STEPS:-1 2 3 4 5} "
want() { [[ "$steps" == *" $1 "* ]]; }

nvidia-smi -L 2>&1 | head -2
nccl_dir=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
for root in site.getsitepackages():
    for path in glob.glob(os.path.join(root, "nvidia", "**", "libnccl.so.2"), recursive=True):
        print(os.path.dirname(path)); raise SystemExit
EOF
)
cudart_dir=$(dirname "$(ldconfig -p | awk '/libcudart.so.13 / {print $NF; exit}')" 2>/dev/null)
[ -n "$cudart_dir" ] && [ "$cudart_dir" != . ] ||
  cudart_dir=$(dirname "$(find / -xdev -name 'libcudart.so.13' 2>/dev/null | head -1)")
# NCCLWATCH_GPU_CHECK_LIBS first: a dry run on the sim (build/sim/lib) checks the script itself.
export LD_LIBRARY_PATH="${NCCLWATCH_GPU_CHECK_LIBS:+$NCCLWATCH_GPU_CHECK_LIBS:}$nccl_dir:$cudart_dir:$prefix/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "INFO nccl from $nccl_dir; cudart from $cudart_dir"
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
timeout 60 "$prefix/examples/nccl_probe" 2>&1 | tail -5

states() {  # TRACE: "OP:STATE" counts of its records, and the doors it was seen through
  "$cli" show --json "$1" | python3 -c '
import collections, json, sys
records = json.load(sys.stdin)["records"]
def key(r):
    flags = "".join("/" + f for f in ("no_events", "start_inferred", "from_plugin") if r.get(f))
    return r["op"] + ":" + r["state"] + flags
print(dict(collections.Counter(key(r) for r in records)))'
  "$cli" show "$1" | grep "^seen through"
}

allreduce_run() {  # NAME ITERS [env...]: allreduce_loop with NCCL's INFO log; sets $trace
  local name=$1 iters=$2
  shift 2
  rm -rf "${out:?}/$name"
  env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCLWATCH_DIR="$out/$name" "$@" \
    timeout 120 "$prefix/examples/allreduce_loop" --iters "$iters" >"$out/$name.log" 2>&1
  echo "rc=$?"
  grep -iE "commId|profiler|ncclwatch|allreduce_loop" "$out/$name.log" | head -12
  trace=$(ls "$out/$name"/*.ncclwatch 2>/dev/null | head -1)
  [ -n "$trace" ] && { "$cli" show "$trace" | sed -n '1,14p'; states "$trace"; }
}

# 1. The preload door with its profiler-plugin role, on real NCCL: every call completes through
# real CUDA events, and NCCL's own commId (NCCL_DEBUG=INFO) is the hash we computed.
if want 1; then
  say "step 1: LD_PRELOAD on real NCCL, 500 allreduces"
  allreduce_run preload 500 LD_PRELOAD="$preload"
  nccl_hash=$(sed -n 's/.*commId 0x\([0-9a-f]*\).*/\1/p' "$out/preload.log" | head -1)
  ours=$([ -n "$trace" ] && "$cli" show "$trace" | awk '/^communicators:/ {getline; getline; print $1; exit}')
  if [ -n "$nccl_hash" ] && [ "$(printf %016x "0x$nccl_hash")" = "$ours" ]; then
    say "PASS commHash: NCCL says $nccl_hash, ncclwatch computed $ours"
  else
    say "FAIL commHash: NCCL says '${nccl_hash}', ncclwatch computed '$ours'"
  fi
fi

# 2. The plugin door alone: NCCL_PROFILER_PLUGIN loads the library, no LD_PRELOAD.
if want 2; then
  say "step 2: NCCL_PROFILER_PLUGIN only"
  allreduce_run plugin 100 NCCL_PROFILER_PLUGIN="$preload"
  [ -n "$trace" ] || say "INFO no trace from the plugin door"
fi

# 3. Host time per call on the real driver, with vs without, interleaved rounds; tracked share.
if want 3; then
rounds=${GPU_CHECK_ROUNDS:-3}
say "step 3: overhead_loop, $rounds interleaved rounds"
loop() {  # NAME SHAPE [env...]
  local name=$1 shape=$2; shift 2
  env NCCLWATCH_DIR="$out/ov/$name" "$@" timeout 60 "$prefix/bench/overhead_loop" $shape \
    2>>"$out/ov/$name.err" | sed -n 's/.*median_ns=\([0-9.]*\).*/\1/p' >>"$out/ov/$name.txt"
}
shed() {  # NAME: calls shed over all its runs (the library's own stderr line), of all calls
  awk '/were not tracked/ {n += $2; m += $4}
       END {if (m) printf "%d of %d calls shed over every run", n, m; else printf "no call shed in any run"}' \
    "$out/ov/$1.err"
}
# A packed lib-base/ (an older libncclwatch.so) is measured beside the current one.
base_lib="$prefix/lib-base/libncclwatch.so"
names="base recording events_b2b events_full_b2b base_paused events events_full"
[ -f "$base_lib" ] && names="$names recording_old events_b2b_old events_old"
rm -rf "$out/ov"; mkdir -p "$out/ov"
for ((round = 0; round < rounds; round++)); do
  loop base "200 1000"
  loop recording "200 1000" LD_PRELOAD="$preload" NCCLWATCH_EVENTS=0 NCCLWATCH_PLUGIN=off
  [ -f "$base_lib" ] && loop recording_old "200 1000" LD_PRELOAD="$base_lib" NCCLWATCH_EVENTS=0 NCCLWATCH_PLUGIN=off
  loop events_b2b "200 1000" LD_PRELOAD="$preload"
  [ -f "$base_lib" ] && loop events_b2b_old "200 1000" LD_PRELOAD="$base_lib"
  loop events_full_b2b "200 1000" LD_PRELOAD="$preload" NCCLWATCH_EVENTS=full
  loop base_paused "100 200 3000"
  loop events "100 200 3000" LD_PRELOAD="$preload"
  [ -f "$base_lib" ] && loop events_old "100 200 3000" LD_PRELOAD="$base_lib"
  loop events_full "100 200 3000" LD_PRELOAD="$preload" NCCLWATCH_EVENTS=full
done
for name in $names; do
  printf '  %-16s median ns per call over rounds: %s\n' "$name" "$(sort -n "$out/ov/$name.txt" | tr '\n' ' ')"
done
for name in events_b2b events_full_b2b events events_full; do
  trace=$(ls "$out/ov/$name"/*.ncclwatch 2>/dev/null | head -1)
  [ -n "$trace" ] && printf '  %-16s last ring %s; %s\n' "$name" "$(states "$trace" | head -1)" "$(shed "$name")"
done
[ -f "$base_lib" ] && for name in events_b2b_old events_old; do printf '  %-16s %s\n' "$name" "$(shed "$name")"; done
timeout 60 "$prefix/bench/driver_cost" 2>&1 | sed 's/^/  /'
[ -x "$prefix/bench/recording_cost" ] &&
  timeout 120 "$prefix/bench/recording_cost" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>&1 | sed 's/^/  /'
# The whole recording path of one call, this build against an older one (packed with
# GPU_CHECK_BASE_BENCH), interleaved.
if [ -x "$prefix/bench/recording_cost_base" ]; then
  for ((round = 0; round < rounds; round++)); do
    for which in recording_cost_base recording_cost; do
      printf '  %-20s ' "$which"
      timeout 60 "$prefix/bench/$which" --benchmark_filter=WholeCallAdded 2>&1 | grep -E "WholeCallAdded" | tr -s ' ' | cut -c1-160
    done
  done
fi
fi

# 4. Real torchrun and ProcessGroupNCCL under `ncclwatch run`; then a collective held behind a
# sleeping kernel, in both event modes: the job's exit code stays 0 and the texts stay honest.
for mode in ${GPU_CHECK_TORCH_MODES:-on full}; do
  want 4 || break
  say "step 4 ($mode): ncclwatch run -- torchrun, 200 all_reduces and one held 6 s behind a kernel"
  rm -rf "$out/torch_$mode"
  NCCLWATCH_EVENTS=$mode NCCLWATCH_WARN_MS=1500 NCCLWATCH_HANG_MS=3000 NCCLWATCH_ON_HANG=dump \
    timeout 150 "$cli" run --dir "$out/torch_$mode" -- \
    python3 -m torch.distributed.run --nproc_per_node=1 scripts/gpu_check_torch.py --stall-s 6 \
    >"$out/torch_$mode.log" 2>&1
  rc=$?
  grep -vE "^\s*$" "$out/torch_$mode.log" | grep -iE "ncclwatch|rank 0|error|Traceback" | cut -c1-220 | head -30
  [ "$rc" = 0 ] && say "PASS torch ($mode): exit 0" || say "FAIL torch ($mode): exit $rc"
  trace=$(ls "$out/torch_$mode"/*.ncclwatch 2>/dev/null | head -1)
  [ -n "$trace" ] && states "$trace"
  "$cli" inspect "$out/torch_$mode" 2>&1 | head -25
done

# 5. train_loop on one rank, under `run`, on the real stack.
if want 5; then
say "step 5: train_loop -n 1 under ncclwatch run"
timeout 120 "$cli" run --dir "$out/train" -- "$cli" launch -n 1 -- "$prefix/examples/train_loop" --steps 3 \
  >"$out/train.log" 2>&1
rc=$?
tail -5 "$out/train.log"
[ "$rc" = 0 ] && say "PASS train_loop: exit 0" || say "FAIL train_loop: exit $rc"
fi
tar -C "$out" -czf "$out/../gpu_check_traces.tgz" . 2>/dev/null && mv "$out/../gpu_check_traces.tgz" "$out/" || true
# 6. Not a GPU check: the collector under 4096 synthetic ranks direct and 32,768 through 4096
# relays (bench/collector_scale.sh), on a host whose 16 cores leave the load generator room
# (on the 2-core development machine it starves the collector). GPU_CHECK_SCALE_MODES: modes;
# a mode ending in "/1" runs with the collector's analysis on one thread (--analysis-threads 1),
# to compare with the default (half the cores, 8 at most), e.g. "relays relays/1"; one starting
# "base:" runs the older ncclwatch packed from GPU_CHECK_BASE_CLI, e.g. "base:4096 4096"; one
# ending in "/rN" runs the collector with N reader threads (--reader-threads N), e.g. "relays/r1".
if want 6; then
  ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true
  for mode in ${GPU_CHECK_SCALE_MODES:-4096 relays}; do
    threads=()
    dir=$prefix
    if [[ $mode == base:* ]]; then  # the older ncclwatch packed from GPU_CHECK_BASE_CLI
      mode=${mode#base:}
      dir=$prefix/base
    fi
    if [[ $mode == */r[0-9]* ]]; then  # e.g. relays/r1: the collector with one reader thread
      threads+=(--reader-threads "${mode##*/r}")
      mode=${mode%/r*}
    fi
    if [[ $mode == */1 ]]; then
      mode=${mode%/1}
      threads+=(--analysis-threads 1)
    fi
    say "step 6: bench/collector_scale.sh $mode ${threads[*]} ($(nproc) cores, $dir)"
    # shellcheck disable=SC2086  # GPU_CHECK_SCALE_ARGS: collector_load options, word-split
    timeout 150 bench/collector_scale.sh "$(realpath --relative-to="$PWD" "$dir")" "$mode" \
      "${threads[@]}" ${GPU_CHECK_SCALE_ARGS:-} 2>&1 | tail -40
  done
fi
# 7. A collective held behind a kernel, aborted by ncclwatch (NCCLWATCH_ON_HANG=abort) behind
# PyTorch's back: NCCL frees the communicator, PyTorch still holds it. The job must fail through
# PyTorch's own error path (its watchdog polls ncclCommGetAsyncError and gets ncclRemoteError
# from the wrappers), never crash on the freed communicator. A packed lib-base/ (an older
# library, which let PyTorch's calls reach NCCL) runs too.
if want 7; then
  for lib in "$preload" "$prefix/lib-base/libncclwatch.so"; do
    [ -f "$lib" ] || continue
    name=abort_$(basename "$(dirname "$lib")")
    say "step 7 ($name): NCCLWATCH_ON_HANG=abort on a collective held ${GPU_CHECK_ABORT_STALL_S:-20} s behind a kernel"
    rm -rf "${out:?}/$name"
    started=$(date +%s%N)
    NCCLWATCH_WARN_MS=1500 NCCLWATCH_HANG_MS=3000 NCCLWATCH_ON_HANG=abort \
      timeout 150 "$cli" run --preload "$lib" --dir "$out/$name" -- \
      python3 -m torch.distributed.run --nproc_per_node=1 scripts/gpu_check_torch.py \
      --stall-s "${GPU_CHECK_ABORT_STALL_S:-20}" >"$out/$name.log" 2>&1
    rc=$?
    say "INFO $name: exit $rc after $(( ($(date +%s%N) - started) / 1000000 )) ms"
    grep -vE "^\s*$|^\s+#[0-9]" "$out/$name.log" |
      grep -iE "ncclwatch\]|error|Traceback|Segmentation|fault|signal|core dump|rank 0:|exitcode" |
      cut -c1-240 | head -40
    grep -q "use after free\|Segmentation fault\|SIGSEGV" "$out/$name.log" &&
      say "FAIL $name: a crash on the freed communicator" || say "INFO $name: no crash seen"
  done
fi
# 8. A rank that never reaches NCCL (rank 1 of 2 sleeps, then fails) while rank 0's first
# all_reduce waits in NCCL's init for it: the verdict names rank 1 as the one that never joined,
# while the job still hangs (NCCLWATCH_INIT_PATIENCE_MS 3 s instead of 30). Rank 1 uses no GPU.
if want 8; then
  late_s=${GPU_CHECK_LATE_RANK_S:-20}
  say "step 8: rank 1 of 2 never reaches NCCL ($late_s s, then fails); rank 0 waits in init"
  rm -rf "${out:?}/late_init"
  started=$(date +%s%N)
  NCCLWATCH_INIT_PATIENCE_MS=3000 NCCLWATCH_ON_HANG=dump \
    timeout 120 "$cli" run --dir "$out/late_init" -- \
    python3 -m torch.distributed.run --nproc_per_node=2 scripts/gpu_check_torch.py \
    --late-rank-s "$late_s" >"$out/late_init.log" 2>&1
  rc=$?
  say "INFO late_init: exit $rc after $(( ($(date +%s%N) - started) / 1000000 )) ms"
  grep -E "ncclwatch\]|gave up|rank 0:|INIT_HANG|never joined" "$out/late_init.log" | cut -c1-240 | head -20
  first=$(grep -m1 '"kind"' "$out/late_init/verdicts.jsonl" 2>/dev/null)
  if [[ $first == *init_hang* && $first == *"rank 1, which never joined"* ]]; then
    say "PASS late_init: the first verdict is INIT_HANG naming rank 1"
  else
    say "FAIL late_init: the first verdict: ${first:0:300}"
  fi
  "$cli" inspect "$out/late_init" 2>&1 | head -20
fi
say "done"
