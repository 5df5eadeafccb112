#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through CTest (unit, integration,
# manifests, lint, the real-kernel VM scenarios); then the unit and integration suites under
# ASan+UBSan and the unit suite and in-process concurrency tests under TSan (hack/sanitize.sh), and
# each libFuzzer target for FUZZ_SECONDS (hack/fuzz.sh, default 60). Exits non-zero on any failure.
# SKIP_SANITIZERS=1 / SKIP_FUZZ=1 leave those out for a quick local run; CI never sets them.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/install-deps.sh
./hack/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure --no-tests=error --timeout 300 -j "$(nproc)"
cd - >/dev/null
skipped=""
if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then ./hack/sanitize.sh; else skipped+=" sanitizers"; fi
if [ "${SKIP_FUZZ:-0}" != 1 ]; then ./hack/fuzz.sh; else skipped+=" fuzzing"; fi
if [ -n "$skipped" ]; then
  echo "test.sh: passed, but NOT run (asked to skip):$skipped" >&2
else
  echo "test.sh: all passed" >&2
fi
