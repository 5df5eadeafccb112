#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through CTest.
# Exits non-zero on any failure; CTest's summary line is the last thing it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/install-deps.sh
./hack/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure --no-tests=error --timeout 300 -j "$(nproc)"
