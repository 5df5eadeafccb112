#!/usr/bin/env bash
# Configures and builds vfio-dra into build/ (or $BUILD_DIR) with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DVFIO_DRA_WERROR=ON "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
