#!/usr/bin/env bash
# Fails when a C/C++ source of the project differs from clang-format's output (.clang-format).
# Usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(find trace analysis watchdog interpose plugin tools sim examples tests bench \
  -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.c' \) | sort)
((${#files[@]})) || exit 0
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run -Werror "${files[@]}"
fi
