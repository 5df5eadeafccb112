#!/usr/bin/env bash
# Configures and builds vfio-dra into build/ (or $BUILD_DIR) with warnings as errors, with ninja
# and ccache when they are installed. VFIO_DRA_BUILD_TARGETS (space-separated) builds only those
# targets; VFIO_DRA_BUILD_NICE runs the compilers at that niceness (CTest's sanitizer builds, so
# that they take the CPU the tests beside them leave idle).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
# ccache makes rebuilds in other trees (build-asan, worktrees) cheap; paths under the parent of the
# checkout are hashed relative to it, so clones at different places share the cache.
if command -v ccache >/dev/null 2>&1; then
  GENERATOR+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd .. && pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DVFIO_DRA_WERROR=ON "$@" >/dev/null
fi
targets=()
for t in ${VFIO_DRA_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
nice=()
[ -n "${VFIO_DRA_BUILD_NICE:-}" ] && nice=(nice -n "$VFIO_DRA_BUILD_NICE")
"${nice[@]}" cmake --build "$BUILD_DIR" --parallel "$(nproc)" "${targets[@]}"
