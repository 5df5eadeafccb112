#!/usr/bin/env bash
# Builds the libFuzzer targets (test/fuzz, in build-asan with ASan + UBSan) and runs each for
# FUZZ_SECONDS (default 60) from its seed corpus in test/fuzz/corpus/<target>. New inputs go to
# build-asan/fuzz-corpus/<target>, so the repository's seeds stay as they are. A crash, a
# sanitizer report, a leak or a timeout fails the run and leaves the input in
# build-asan/fuzz-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/install-deps.sh
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
CC=clang CXX=clang++ BUILD_DIR=build-asan ./hack/build.sh \
  -DVFIO_DRA_SANITIZE=address,undefined -DVFIO_DRA_FUZZ=ON
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p build-asan/fuzz-artifacts
failed=0
for seeds in test/fuzz/corpus/*/; do
  target=$(basename "$seeds")
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
