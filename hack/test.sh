#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through CTest: unit, integration,
# manifests, lint, the real-kernel VM scenarios, the real control plane, the real node; the unit
# and integration suites under ASan+UBSan and the unit suite and in-process concurrency tests
# under TSan (hack/sanitize.sh's stages, label sanitize); and each libFuzzer target for
# FUZZ_SECONDS (hack/fuzz.sh, default 60; label fuzz). One CTest run, so that the CPU-bound stages
# fill the time the scenarios spend waiting. Exits non-zero on any failure.
#   ./hack/test.sh           everything, as CI runs it (.ci/run)
#   ./hack/test.sh --quick   contributors' inner loop: build, then the unit and integration
#                            suites only (a few minutes); says what it left out
# SKIP_SANITIZERS=1 / SKIP_FUZZ=1 leave those stages out of a full run; CI never sets them.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "test.sh: unknown argument '$1' (usage: hack/test.sh [--quick])" >&2; exit 2 ;;
esac
./hack/install-deps.sh
./hack/build.sh
BUILD_DIR=${BUILD_DIR:-build}
if [ "$quick" = 1 ]; then
  ctest --test-dir "$BUILD_DIR" -L 'unit|integration' --output-on-failure --no-tests=error \
    --timeout 300 -j "$(nproc)"
  echo "test.sh --quick: unit and integration passed; NOT run: lint, manifests, image," \
    "real-kernel VM scenarios, real control plane and node, sanitizers, fuzzing (run" \
    "./hack/test.sh before a pull request)" >&2
  exit 0
fi
skipped=""
excluded=()
if [ "${SKIP_SANITIZERS:-0}" = 1 ]; then skipped+=" sanitizers"; excluded+=(sanitize); fi
if [ "${SKIP_FUZZ:-0}" = 1 ]; then skipped+=" fuzzing"; excluded+=(fuzz); fi
exclude=()
if [ ${#excluded[@]} != 0 ]; then exclude=(-LE "^($(IFS='|'; echo "${excluded[*]}"))\$"); fi
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error --timeout 300 -j "$(nproc)" \
  "${exclude[@]}"
if [ -n "$skipped" ]; then
  echo "test.sh: passed, but NOT run (asked to skip):$skipped" >&2
else
  echo "test.sh: all passed" >&2
fi
