#!/usr/bin/env bash
# Unpacks PyPI's nvidia-nccl-cu13 wheel (a newer real NCCL than the toolkit's 2.28.9: its
# libnccl.so.2 and nccl.h) into DIR, once. Tests use it to check what that NCCL's loader probes
# and which API it declares. Usage: scripts/nccl_wheel.sh DIR [VERSION]. Exits 0 without it
# when PyPI cannot be reached (the tests that need it then skip, saying why).
set -uo pipefail
dir=${1:?usage: scripts/nccl_wheel.sh DIR [VERSION]}
version=${2:-2.32.3}
marker="$dir/.nvidia-nccl-cu13-$version"
[ -f "$marker" ] && exit 0
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --no-deps --dest "$tmp" "nvidia-nccl-cu13==$version" \
    >"$tmp/log" 2>&1; then
  echo "[nccl_wheel] could not download nvidia-nccl-cu13==$version (offline?): $(tail -1 "$tmp/log")"
  exit 0
fi
python3 -m zipfile -e "$tmp"/nvidia_nccl_cu13-*.whl "$dir" && touch "$marker"
