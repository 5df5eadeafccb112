#!/usr/bin/env bash
# Checks the include layering of src/ (hack/check_layering.py: data flows one way), formatting
# (clang-format, Google style, 100 columns) of all C++ sources, and runs clang-tidy over the
# daemon's sources. Needs a configured build dir for compile_commands.json.
# Usage: hack/lint.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
python3 hack/check_layering.py --self-test
python3 hack/check_layering.py src
mapfile -t sources < <(git ls-files '*.cc' '*.h' 2>/dev/null || find src test -name '*.cc' -o -name '*.h')
clang-format --dry-run --Werror "${sources[@]}"
echo "clang-format: ${#sources[@]} files clean"
mapfile -t tidy < <(printf '%s\n' "${sources[@]}" | grep -E '^src/.*\.cc$')
printf '%s\n' "${tidy[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$BUILD_DIR" --quiet 2>/dev/null
echo "clang-tidy: ${#tidy[@]} files clean"
