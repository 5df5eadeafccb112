#!/usr/bin/env bash
# Builds the libFuzzer targets (test/fuzz, in build-asan with ASan + UBSan) and runs each for
# FUZZ_SECONDS (default 60) from its seed corpus in test/fuzz/corpus/<target>. New inputs go to
# build-asan/fuzz-corpus/<target>, so the repository's seeds stay as they are. A crash, a
# sanitizer report, a leak or a timeout fails the run and leaves the input in
# build-asan/fuzz-artifacts/.
#   hack/fuzz.sh [--no-build] [TARGET...]
#                 every target (default) or those named; --no-build runs an existing build-asan
#                 (./hack/test.sh runs each target as a CTest test, fuzz_<target>, after CTest's
#                 sanitize_asan_build, which makes that build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [ "${1:-}" = --no-build ]; then
  build=0
  shift
fi
targets=("$@")
if [ ${#targets[@]} = 0 ]; then
  for seeds in test/fuzz/corpus/*/; do targets+=("$(basename "$seeds")"); done
fi
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
# The fuzz targets are built in hack/sanitize.sh's ASan tree, by its own build step.
if [ "$build" = 1 ]; then ./hack/sanitize.sh asan-build; fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p build-asan/fuzz-artifacts
failed=0
for target in "${targets[@]}"; do
  seeds=test/fuzz/corpus/$target/
  if [ ! -d "$seeds" ] || [ ! -x ./build-asan/test/fuzz/"$target" ]; then
    echo "fuzz: no target '$target' (needs test/fuzz/corpus/$target/ and" \
      "build-asan/test/fuzz/$target: hack/fuzz.sh without --no-build builds it)" >&2
    failed=1
    continue
  fi
  corpus=build-asan/fuzz-corpus/$target
  mkdir -p "$corpus"
  log=build-asan/fuzz-artifacts/$target.log
  if ./build-asan/test/fuzz/"$target" "$corpus" "$seeds" -max_total_time="$SECONDS_PER_TARGET" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix=build-asan/fuzz-artifacts/"$target"- >"$log" 2>&1; then
    stats=$(grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tr '\n' ' ')
    echo "fuzz: $target ok: $stats" >&2
  else
    echo "fuzz: $target FAILED; the log is $log:" >&2
    tail -n 40 "$log" >&2
    failed=1
  fi
done
exit $failed
