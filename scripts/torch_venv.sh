#!/usr/bin/env bash
# Creates a Python virtual environment with PyPI's torch (the CUDA 13 build and its nvidia-*
# wheels) for the tests labelled `torch`, which run unmodified PyTorch on the sim.
# Usage: scripts/torch_venv.sh [DIR] (default build/torch-venv).
# Idempotent: a venv that already imports torch is left as it is (well under a second).
# pip keeps no cache (--no-cache-dir): on a fresh machine the cache would only add ~3 GB of
# wheels next to the 5 GB venv, and the marker below already makes a second run free.
# Exits 0 when DIR/bin/python imports torch; otherwise prints one line saying why and exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/torch-venv}
package=${NCCLWATCH_TORCH_PACKAGE:-torch}
marker="$dir/.ncclwatch-torch-ok"

if [ -f "$marker" ] && [ -x "$dir/bin/python" ]; then
  exit 0
fi
if [ ! -x "$dir/bin/python" ]; then
  if ! python3 -m venv "$dir" >/dev/null 2>&1; then
    echo "[torch_venv] cannot create a virtual environment in $dir (python3 -m venv failed)"
    exit 2
  fi
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "[torch_venv] installing $package into $dir (about 5 GB, ~1 min when PyPI is reachable)"
if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$package" \
    >"$log" 2>&1; then
  echo "[torch_venv] pip install $package failed (offline?): $(grep -v '^\s*$' "$log" | tail -1)"
  exit 2
fi
# Import without any GPU library of ours: torch must load on a machine without a GPU.
if ! version=$("$dir/bin/python" -c 'import torch; print(torch.__version__)' 2>"$log"); then
  echo "[torch_venv] torch installed but does not import: $(tail -1 "$log")"
  exit 2
fi
echo "$version" >"$marker"
echo "[torch_venv] torch $version ready in $dir"
