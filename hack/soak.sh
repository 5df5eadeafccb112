#!/usr/bin/env bash
# Faults at random on the real node (issue 57):
#   hack/soak.sh [--minutes M] [--seed S] [--churn S] [--fault-gap S]
# Boots the real node (test/real-node, QEMU with the real kubelet and containerd, the real
# control plane on this machine), runs a stream of VM pods with faults at random times for M
# minutes (default 60), pausing the stream about every --churn seconds (default 300) to let the
# node settle and check its invariants (and at the end); faults come on their own clock, on
# average --fault-gap seconds from one's start to the next's (default 18), while pods stream. Prints the figures and writes them to
# docs/benchmarks.md. The seed is printed first; a failing run is replayed with --seed (and the
# same --churn and --fault-gap). Needs a build (BUILD_DIR,
# default build) with vfio-dra-plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
minutes=60
seed=()
more=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --seed) seed=(--seed "$2"); shift 2 ;;
    --churn | --fault-gap) more+=("$1" "$2"); shift 2 ;;
    *) echo "usage: hack/soak.sh [--minutes M] [--seed S] [--churn S] [--fault-gap S]" >&2
       exit 2 ;;
  esac
done
[ -x "$BUILD_DIR/src/vfio-dra-plugin" ] ||
  { echo "hack/soak.sh: $BUILD_DIR/src/vfio-dra-plugin is missing (hack/build.sh)" >&2; exit 1; }
# What the node needs, built or taken from the cache: the kernel and mtty (as CTest's
# e2e_vm_setup), the kubelet, containerd and the test images (real_node_binaries).
test/e2e-vm/prepare-vm.sh >/dev/null
test/real-node/binaries.sh >/dev/null
exec /usr/bin/python3 test/real-node/soak.py --release 1.37 --build-dir "$BUILD_DIR" \
  --work-dir "$BUILD_DIR/test/real-node/soak-bench" --minutes "$minutes" "${seed[@]}" "${more[@]}" \
  --benchmarks docs/benchmarks.md
