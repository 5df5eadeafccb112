#!/usr/bin/env bash
# Installs the build and test dependencies of vfio-dra from Debian 12 packages.
# Idempotent: when every package is already present it prints nothing and exits 0.
# --build-only: just what building the plugin needs (the image's build stage).
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config ccache
  # wire definitions and the kubelet-facing gRPC server (gRPC C++)
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev
  # libraries the daemon links
  libboost-filesystem-dev libfmt-dev libspdlog-dev libpci-dev pci.ids
  libssl-dev libcpp-httplib-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libudev-dev
  libmnl-dev prometheus-cpp-dev
)
TEST_PACKAGES=(
  # lint, and clang for the sanitizer and libFuzzer builds
  clang-format clang-tidy clang libclang-rt-14-dev
  # tests
  libgtest-dev libgmock-dev libbenchmark-dev curl openssl python3 python3-yaml
  # the Prometheus text-format parser that checks /metrics (promtool comes only with the whole
  # Prometheus server package, about 96 MB installed)
  python3-prometheus-client
  # the container image (hack/image.sh); its tests run no container engine here (the real node
  # runs the image in containerd, inside its VM)
  mmdebstrap umoci skopeo
  # the real-kernel VM node (test/e2e-vm/prepare-vm.sh adds the kernel itself and its headers)
  qemu-system-x86 busybox-static kmod cpio xz-utils make gcc
  # the real node's container runtime (hack/node-runtime-binaries.sh builds runc with seccomp;
  # pkg-config is in PACKAGES), its CNI plugins (/usr/lib/cni) and socat for the kubelet's
  # port-forward
  libseccomp-dev containernetworking-plugins socat
  # AppArmor's parser: the real node's kernel enforces AppArmor (the plugin's profile from
  # deploy/apparmor and containerd's default), with the parser of this root file system
  apparmor
)

if [ "${1:-}" != "--build-only" ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
