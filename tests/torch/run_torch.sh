#!/usr/bin/env bash
# Runs one tests/torch script with unmodified PyPI PyTorch on the sim: the venv's python (NPROC 0)
# or the venv's real torchrun with NPROC ranks, with the sim's libcuda.so.1, libcudart.so.13 and
# libnccl.so.2 in LD_PRELOAD (torch's RPATH would otherwise pick its own nvidia-* wheels). Passes
# when the run exits 0 and every rank's last line says "rank R: N checks passed" with N >= MIN.
# Exits 77 (ctest: skipped) with one line when the venv is missing (scripts/torch_venv.sh).
# Usage: run_torch.sh VENV SIM_LIB_DIR NPROC MIN_CHECKS SCRIPT [ARGS...]
set -uo pipefail
venv=$1 sim=$2 nproc=$3 min_checks=$4 script=$5
shift 5
if [ ! -f "$venv/.ncclwatch-torch-ok" ] || [ ! -x "$venv/bin/python" ]; then
  echo "SKIPPED: no torch venv at $venv (scripts/torch_venv.sh $venv installs it; needs PyPI)"
  exit 77
fi
preload="$sim/libcuda.so.1:$sim/libcudart.so.13:$sim/libnccl.so.2"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s%N)
if [ "$nproc" = 0 ]; then
  LD_PRELOAD=$preload "$venv/bin/python" "$script" "$@" >"$log" 2>&1
  ranks=1
else
  # --standalone: a free rendezvous port, so tests may run side by side.
  LD_PRELOAD=$preload "$venv/bin/torchrun" --standalone --nproc_per_node="$nproc" "$script" "$@" \
    >"$log" 2>&1
  ranks=$nproc
fi
status=$?
cat "$log"
echo "[run_torch] exit $status after $((($(date +%s%N) - start) / 1000000)) ms"
[ "$status" = 0 ] || exit 1
for ((r = 0; r < ranks; r++)); do
  count=$(grep -oE "^rank $r: [0-9]+ checks passed" "$log" | grep -oE '[0-9]+ checks' | grep -oE '[0-9]+')
  if [ -z "$count" ] || [ "$count" -lt "$min_checks" ]; then
    echo "[run_torch] rank $r did not report $min_checks passed checks"
    exit 1
  fi
done
if grep -q "FAILED" "$log"; then
  echo "[run_torch] a check failed"
  exit 1
fi
