#!/usr/bin/env bash
# vfio-dra demo on a real Linux kernel: installs what is missing, builds, boots a VM node
# (Debian 12's kernel under QEMU, emulated Intel IOMMU, no network) and runs the real
# vfio-dra-plugin in it with the kubelet and API-server stand-ins: the published slices, a
# passthrough GPU and a vGPU (mdev) prepared and unprepared, the CDI spec and the KubeVirt
# metadata file. Nothing on this machine's /sys is touched. The first run downloads the kernel
# packages (cached); later runs boot in seconds. ./hack/demo-simulated.sh shows the same without a
# VM, on a simulated kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/install-deps.sh
echo "Building vfio-dra in build/: a first build compiles about 130 files, several minutes on 2"
echo "cores; later builds take seconds (ninja and ccache). Ninja's [done/total] lines are the progress:"
./hack/build.sh 2>&1 | sed -u 's/^/  /'
OUT=$(mktemp -d /tmp/vfio-dra-demo.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
echo "Preparing the VM node (kernel, initramfs, mtty sample driver): the first run installs QEMU,"
echo "downloads the kernel packages and builds the driver (several minutes); later runs reuse them..."
./test/e2e-vm/prepare-vm.sh >/dev/null
started=$(date +%s%N)
./test/e2e-vm/run-vm.sh "$OUT" test/e2e-vm/scenarios.py demo 2> >(grep -v 'has no peer' >&2)
elapsed_ms=$((($(date +%s%N) - started) / 1000000))
printf '\nThe VM booted, ran the demo and powered off in %d.%01d s.\n' \
  $((elapsed_ms / 1000)) $((elapsed_ms % 1000 / 100))
