#!/usr/bin/env bash
# Boots the real-kernel VM node (Debian 12's kernel under QEMU TCG with an emulated Intel IOMMU)
# and runs PROGRAM (a path on this machine, run in the guest as root in a chroot of this
# machine's file system, shared read-only) against the guest's real /sys and /dev. OUT (a
# directory on this machine) receives console.log, guest.log and exit-code, and gives the guest
# the scenario name, the build directory ($BUILD_DIR, default <repo>/build) and the kernel
# cache. Exits with the program's code.
#   run-vm.sh OUT PROGRAM [SCENARIO]
# The node: a "GPU" (QEMU VGA, class 0x0300) with an HDA audio function in its group; an e1000e
# alone in its group (to pass through); an e1000e that stands for the node's own NIC; an e1000e
# sharing a group with a second function that stays on its host driver; an NVMe controller with
# SR-IOV (up to 4 VFs). No network. Nothing on this machine's /sys is touched.
# For the real node (test/real-node), three settings from the environment:
#   VFIO_DRA_VM_API_PORT=PORT  a virtio NIC (MAC 52:54:00:00:00:10) on QEMU's user network with
#                              `restrict=on`: the guest reaches nothing but 10.0.2.100:6443, which
#                              QEMU hands to socat, which connects to 127.0.0.1:PORT on this
#                              machine (the API server); no packet leaves QEMU otherwise
#   VFIO_DRA_VM_MEMORY=MiB     the guest's memory (default 1536)
#   VFIO_DRA_VM_ROOT=overlay   a writable root in the guest's memory (guest-init.sh)
set -euo pipefail
mkdir -p "$1"
OUT=$(realpath "$1")
PROGRAM=$(realpath "$2")
SCENARIO=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD_DIR=$(realpath "${BUILD_DIR:-$HERE/../../build}")
CACHE=$("$HERE/prepare-vm.sh")
KVER=$(cat "$CACHE/kernel-version")
mkdir -p "$OUT"
rm -f "$OUT/exit-code" "$OUT/guest.log"
echo "$CACHE" >"$OUT/cache-dir"
echo "$KVER" >"$OUT/kernel-version"
echo "$BUILD_DIR" >"$OUT/build-dir"
echo "$SCENARIO" >"$OUT/scenario"
realpath "$HERE/../.." >"$OUT/source-dir"
net=(-nic none)
if [[ -n "${VFIO_DRA_VM_API_PORT:-}" ]]; then
  net=(-netdev "user,id=api,restrict=on,ipv6=off,guestfwd=tcp:10.0.2.100:6443-cmd:socat STDIO TCP:127.0.0.1:$VFIO_DRA_VM_API_PORT"
    -device virtio-net-pci,netdev=api,bus=pcie.0,addr=0x6,mac=52:54:00:00:00:10)
fi
extra_append=""
[[ -n "${VFIO_DRA_VM_ROOT:-}" ]] && extra_append=" vfio_dra.root=$VFIO_DRA_VM_ROOT"
# QEMU's "nic has no peer" warnings are expected: the NICs are there to be passed through.
# no_timer_check: under TCG on a loaded host the kernel's early check that the timer interrupt
# arrives through the remapped IO-APIC can miss its window and panic ("timer doesn't work through
# Interrupt-remapped IO-APIC", seen in a CI run); the timer works, only the check is too eager.
timeout "${VFIO_DRA_E2E_VM_TIMEOUT:-600}" qemu-system-x86_64 \
  -machine q35,kernel-irqchip=split -accel tcg -cpu max -smp 2 -m "${VFIO_DRA_VM_MEMORY:-1536}" \
  -device intel-iommu,intremap=on,caching-mode=on \
  -vga none -display none -serial "file:$OUT/console.log" -monitor none -no-reboot "${net[@]}" \
  -kernel "$CACHE/kernel/boot/vmlinuz-$KVER" -initrd "$CACHE/initramfs.cpio.gz" \
  -append "console=ttyS0 intel_iommu=on panic=-1 loglevel=4 no_timer_check vfio_dra.run=$PROGRAM$extra_append" \
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$OUT,mount_tag=out,security_model=none" \
  -device pcie-root-port,id=rp1,bus=pcie.0,chassis=1,addr=0x4.0,multifunction=on \
  -device VGA,bus=rp1,addr=0.0,multifunction=on -device intel-hda,bus=rp1,addr=0.1 \
  -device pcie-root-port,id=rp2,bus=pcie.0,chassis=2,addr=0x4.1 \
  -device e1000e,bus=rp2,mac=52:54:00:00:00:02 \
  -device pcie-root-port,id=rp3,bus=pcie.0,chassis=3,addr=0x4.2 \
  -device e1000e,bus=rp3,mac=52:54:00:00:00:03 \
  -device pcie-root-port,id=rp4,bus=pcie.0,chassis=4,addr=0x4.3 \
  -device e1000e,bus=rp4,addr=0.0,multifunction=on,mac=52:54:00:00:00:04 \
  -device e1000e,bus=rp4,addr=0.1,mac=52:54:00:00:00:05 \
  -device pcie-root-port,id=rp5,bus=pcie.0,chassis=5,addr=0x4.4 \
  -device nvme-subsys,id=nvmesubsys0 \
  -device nvme,bus=rp5,serial=vfiodra0,subsys=nvmesubsys0,sriov_max_vfs=4,sriov_vq_flexible=8,sriov_vi_flexible=4,max_ioqpairs=12,msix_qsize=13
if [[ ! -f "$OUT/exit-code" ]]; then
  echo "run-vm: the guest did not finish (see $OUT/console.log)" >&2
  tail -30 "$OUT/console.log" >&2 || true
  exit 125
fi
cat "$OUT/guest.log"
exit "$(cat "$OUT/exit-code")"
