#!/usr/bin/env bash
# Checks the include layering of src/ (hack/check_layering.py: data flows one way), formatting
# (clang-format, Google style, 100 columns) of all C++ sources, and runs clang-tidy over the
# daemon's sources (each unit once per change: hack/clang_tidy_cached.py). Needs a configured build
# dir for compile_commands.json.
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
# Units found clean before with the same preprocessed input, flags, configuration and clang-tidy
# are not run again (hack/clang_tidy_cached.py): the full run is a quarter of an hour of a core.
python3 hack/clang_tidy_cached.py "$BUILD_DIR" "${tidy[@]}"
