#!/usr/bin/env bash
# Builds the real node's two local images, with no registry: the pod sandbox image (pause.c, under
# the name containerd's CRI asks for) and the test image the scenarios' pods run (Debian's static
# busybox, vfio-check.c, and kubevirt-vmi from hack/kubevirt-binary.sh: virt-launcher's code that
# finds a VMI's DRA devices). Each is a Docker archive made with umoci and skopeo (as
# hack/image.sh makes the plugin's), which `ctr images import` takes with its name. Cached under
# ~/.cache/vfio-dra/real-node-images/ by the hash of the sources and the busybox binary.
#   images.sh            prints the directory holding pause.tar and test.tar
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VFIO_DRA_KUBE_CACHE:-$HOME/.cache/vfio-dra}/real-node-images
SANDBOX_IMAGE=registry.k8s.io/pause:3.10.1
TEST_IMAGE=vfio-dra.test/node-test:1
for tool in umoci skopeo gcc; do
  command -v "$tool" >/dev/null || { echo "images.sh: $tool is missing (hack/install-deps.sh)" >&2; exit 1; }
done
[[ -x /bin/busybox ]] || { echo "images.sh: /bin/busybox is missing (busybox-static)" >&2; exit 1; }
kubevirt=$("$HERE/../../hack/kubevirt-binary.sh")/kubevirt-vmi
key=$(cat "$0" "$HERE/pause.c" "$HERE/vfio_check.c" /bin/busybox "$kubevirt" | sha256sum |
  cut -c1-16)
if [[ -f "$CACHE/$key/test.tar" && -f "$CACHE/$key/pause.tar" ]]; then
  echo "$CACHE/$key"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# image NAME ARCHIVE ROOTFS ENTRYPOINT...: one layer holding ROOTFS, as a Docker archive.
image() {
  local name=$1 archive=$2 rootfs=$3
  shift 3
  local layout=$work/oci-$(basename "$archive" .tar)
  umoci init --layout "$layout"
  umoci new --image "$layout:img"
  tar --numeric-owner --owner=0 --group=0 -C "$rootfs" -cf "$work/layer.tar" .
  umoci raw add-layer --image "$layout:img" "$work/layer.tar"
  local args=()
  for word in "$@"; do args+=("--config.entrypoint=$word"); done
  umoci config --image "$layout:img" "${args[@]}" --config.workingdir=/
  skopeo copy --quiet "oci:$layout:img" "docker-archive:$archive:$name"
}

mkdir -p "$work/pause-root" "$work/test-root/bin" "$work/out"
gcc -static -O2 -Wall -Werror -o "$work/pause-root/pause" "$HERE/pause.c"
gcc -static -O2 -Wall -Werror -o "$work/test-root/bin/vfio-check" "$HERE/vfio_check.c"
cp /bin/busybox "$work/test-root/bin/busybox"
cp "$kubevirt" "$work/test-root/bin/kubevirt-vmi"
ln -s busybox "$work/test-root/bin/sh"
image "$SANDBOX_IMAGE" "$work/out/pause.tar" "$work/pause-root" /pause
image "$TEST_IMAGE" "$work/out/test.tar" "$work/test-root" /bin/sh
mkdir -p "$CACHE"
rm -rf "${CACHE:?}/$key"
mv "$work/out" "$CACHE/$key"
echo "$CACHE/$key"
