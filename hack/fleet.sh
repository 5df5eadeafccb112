#!/usr/bin/env bash
# The fleet benchmark (#54, test/fleet/README.md): N live vfio-dra plugins and up to 1,000 nodes
# of slices on the real control plane of the current release; prints one table (start-up, idle,
# API server restart, etcd and API server cost per node, the real scheduler's pods/s with and
# without counters) and writes the figures as JSON. About 40 minutes on 2 cores.
#   ./hack/fleet.sh [--live 100] [--nodes 1000] [--pods 5000] [--idle 300]
# The short smoke with its correctness assertions runs in ./hack/test.sh (CTest fleet_smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
VFIO_DRA_BUILD_TARGETS="vfio-dra-plugin vfio-dra-sim-daemon make-fixture kubelet-sim" ./hack/build.sh
work=${FLEET_WORK_DIR:-/tmp/vfio-dra-fleet}
exec /usr/bin/python3 test/fleet/benchmark.py --build-dir "$BUILD_DIR" --work-dir "$work" \
  --json "$work.json" "$@"
