#!/usr/bin/env bash
# Runs the unit and integration suites under AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan, clang; the libFuzzer targets are built there too; the integration suites run the
# daemon binaries of that build, so they are checked too), and the concurrency tests under
# ThreadSanitizer (build-tsan): the unit suite and the in-process integration suites (the slice
# reconciler, the API client with its watches). The daemon-process suites are not run under TSan:
# Debian's gRPC and Abseil are not built with it, so TSan cannot see their synchronization and
# reports races inside them. Every sanitizer report is fatal, so any finding fails the run.
#   hack/sanitize.sh             everything below, in order
#   hack/sanitize.sh asan-build  builds build-asan (with the fuzz targets, for hack/fuzz.sh)
#   hack/sanitize.sh asan-test   runs the suites of an existing build-asan
#   hack/sanitize.sh tsan        builds build-tsan and runs its suites
# ./hack/test.sh runs the stages as CTest tests (label sanitize), beside the others.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-all}
case "$stage" in
  all | asan-build | asan-test | tsan) ;;
  *) echo "sanitize.sh: unknown stage '$stage' (usage: hack/sanitize.sh [asan-build|asan-test|tsan])" >&2
    exit 2 ;;
esac
./hack/install-deps.sh

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_init_order=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

if [ "$stage" = all ] || [ "$stage" = asan-build ]; then
  echo "sanitize: building with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)" >&2
  CC=clang CXX=clang++ BUILD_DIR=build-asan ./hack/build.sh \
    -DVFIO_DRA_SANITIZE=address,undefined -DVFIO_DRA_FUZZ=ON
fi
if [ "$stage" = all ] || [ "$stage" = asan-test ]; then
  if [ ! -x build-asan/test/unit_tests ]; then
    echo "sanitize.sh: build-asan is not built (run hack/sanitize.sh asan-build first)" >&2
    exit 1
  fi
  echo "sanitize: the unit and integration suites under ASan + UBSan (build-asan)" >&2
  ctest --test-dir build-asan -L 'unit|integration' --output-on-failure --no-tests=error \
    --timeout 600 -j "$(nproc)"
fi
if [ "$stage" = all ] || [ "$stage" = tsan ]; then
  echo "sanitize: ThreadSanitizer (build-tsan)" >&2
  CC=clang CXX=clang++ BUILD_DIR=build-tsan VFIO_DRA_BUILD_TARGETS="unit_tests integration_tests" \
    ./hack/build.sh -DVFIO_DRA_SANITIZE=thread
  # PluginServerTest and SocketServerTest run the plugin's server and its clients on gRPC C++: the
  # same uninstrumented gRPC and Abseil as above, whose own synchronisation TSan cannot see.
  ./build-tsan/test/unit_tests --gtest_brief=1 --gtest_filter='-PluginServerTest.*:SocketServerTest.*'
  ./build-tsan/test/integration_tests --gtest_brief=1 \
    --gtest_filter='SliceReconcilerTest.*:KubeClientTest.*'
fi
