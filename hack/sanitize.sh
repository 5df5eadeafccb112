#!/usr/bin/env bash
# Runs the unit and integration suites under AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan, clang; the libFuzzer targets are built there too; the integration suites run the
# daemon binaries of that build, so they are checked too), and the concurrency tests under
# ThreadSanitizer (build-tsan): the unit suite and the in-process integration suites (the slice
# reconciler, the API client with its watches). The daemon-process suites are not run under TSan:
# Debian's gRPC and Abseil are not built with it, so TSan cannot see their synchronization and
# reports races inside them. Every sanitizer report is fatal, so any finding fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/install-deps.sh

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_init_order=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

echo "sanitize: AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)" >&2
CC=clang CXX=clang++ BUILD_DIR=build-asan ./hack/build.sh \
  -DVFIO_DRA_SANITIZE=address,undefined -DVFIO_DRA_FUZZ=ON
ctest --test-dir build-asan -L 'unit|integration' --output-on-failure --no-tests=error \
  --timeout 600 -j "$(nproc)"

echo "sanitize: ThreadSanitizer (build-tsan)" >&2
if [ ! -f build-tsan/CMakeCache.txt ]; then
  CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DVFIO_DRA_WERROR=ON \
    -DVFIO_DRA_SANITIZE=thread >/dev/null
fi
cmake --build build-tsan --target unit_tests integration_tests --parallel "$(nproc)"
# PluginServerTest and SocketServerTest run the plugin's server and its clients on gRPC C++: the
# same uninstrumented gRPC and Abseil as above, whose own synchronisation TSan cannot see.
./build-tsan/test/unit_tests --gtest_brief=1 --gtest_filter='-PluginServerTest.*:SocketServerTest.*'
./build-tsan/test/integration_tests --gtest_brief=1 \
  --gtest_filter='SliceReconcilerTest.*:KubeClientTest.*'
