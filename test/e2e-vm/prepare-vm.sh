#!/usr/bin/env bash
# Prepares everything the real-kernel VM node needs, from Debian packages, into a cache that
# later runs reuse: QEMU and busybox (apt), Debian 12's kernel image (extracted, not installed),
# the kernel headers (to build the mtty sample mdev driver and the netdevsim driver out of tree,
# from linux-source-6.1), and an initramfs with the few modules the guest needs to mount the
# host's file system (9p).
# Prints the cache directory.
set -euo pipefail
CACHE=${VFIO_DRA_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfio-dra/e2e-vm}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$CACHE"
cd "$CACHE"
log() { echo "prepare-vm: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive

# Package lists on a fresh machine can be older than the archive (an image built weeks ago): the
# versions they name are gone from the mirror and every fetch would fail with 404. Refresh them
# once, before the first fetch, and only when something has to be fetched.
lists_fresh=0
refresh_lists() {
  ((lists_fresh)) && return 0
  log "refreshing the package lists (apt-get update)"
  apt-get update -qq >&2 || { log "apt-get update failed: cannot reach the Debian archive"; exit 1; }
  lists_fresh=1
}

need=()
for pkg in qemu-system-x86 busybox-static kmod cpio xz-utils make gcc; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if ((${#need[@]})); then
  refresh_lists
  log "installing ${need[*]}"
  apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi

# The kernel flavour Debian 12 ships now (linux-image-amd64 depends on it).
if [[ ! -s kernel-version ]]; then
  refresh_lists
  apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: linux-image-\(.*\)$/\1/p' | head -1 \
    >kernel-version
fi
KVER=$(cat kernel-version)
[[ -n "$KVER" ]] || { log "cannot tell the Debian kernel version"; exit 1; }

if [[ ! -f "kernel/boot/vmlinuz-$KVER" ]]; then
  refresh_lists
  log "fetching linux-image-$KVER"
  apt-get download -q "linux-image-$KVER" >&2
  rm -rf kernel && mkdir kernel
  dpkg-deb -x linux-image-"$KVER"_*.deb kernel
  depmod -b kernel "$KVER"
  rm -f linux-image-"$KVER"_*.deb
fi

if ! dpkg-query -W -f='${Status}' "linux-headers-$KVER" 2>/dev/null | grep -q 'install ok installed'; then
  refresh_lists
  log "installing linux-headers-$KVER (headers only; the host kernel is not touched)"
  apt-get install -y -q --no-install-recommends "linux-headers-$KVER" >&2 || {
    log "cannot install linux-headers-$KVER; if the archive no longer has it, remove $CACHE to" \
      "start over with the kernel Debian ships now"
    exit 1
  }
fi

# Out-of-tree modules from linux-source-6.1 (the .deb is fetched once, for whichever sources are
# missing): the mtty sample mdev driver, and netdevsim (a real SR-IOV netdev driver whose VFs
# take MAC, VLAN, spoofchk and trust through rtnetlink), which Debian's kernel does not build.
# netdevsim's Makefile is replaced by a Kbuild with its objects as Debian's config enables them.
NETDEVSIM_OBJS="netdev.o dev.o ethtool.o fib.o bus.o health.o hwstats.o udp_tunnels.o bpf.o"
NETDEVSIM_OBJS+=" ipsec.o psample.o"
missing=()
[[ -f mtty/mtty.c || -f mtty/mtty.ko ]] || missing+=(linux-source-6.1/samples/vfio-mdev/mtty.c)
[[ -f netdevsim/netdev.c || -f netdevsim/netdevsim.ko ]] ||
  missing+=(linux-source-6.1/drivers/net/netdevsim)
if ((${#missing[@]})); then
  refresh_lists
  log "fetching linux-source-6.1 for ${missing[*]#linux-source-6.1/}"
  rm -rf source && mkdir source
  (cd source && apt-get download -q linux-source-6.1 >&2)
  dpkg-deb --fsys-tarfile source/linux-source-6.1_*.deb |
    tar -xO ./usr/src/linux-source-6.1.tar.xz | xz -dc | tar -x -C source "${missing[@]}"
  # Moved into place whole, so that an interrupted run leaves no half source to build from.
  if [[ -d source/linux-source-6.1/samples/vfio-mdev ]]; then
    mkdir -p mtty && mv source/linux-source-6.1/samples/vfio-mdev/mtty.c mtty/
  fi
  if [[ -d source/linux-source-6.1/drivers/net/netdevsim ]]; then
    rm -rf netdevsim && mv source/linux-source-6.1/drivers/net/netdevsim netdevsim
  fi
  rm -rf source
fi
if [[ ! -f mtty/mtty.ko ]]; then
  echo 'obj-m := mtty.o' >mtty/Makefile
  make -s -C "/usr/src/linux-headers-$KVER" M="$CACHE/mtty" modules >&2
fi
if [[ ! -f netdevsim/netdevsim.ko ]]; then
  log "building netdevsim.ko"
  rm -f netdevsim/Makefile
  printf 'obj-m += netdevsim.o\nnetdevsim-objs := %s\n' "$NETDEVSIM_OBJS" >netdevsim/Kbuild
  make -s -C "/usr/src/linux-headers-$KVER" M="$CACHE/netdevsim" modules >&2
fi

# The initramfs: busybox, the 9p and overlay modules (and what they need), and our init.
if [[ ! -f initramfs.cpio.gz || "$HERE/guest-init.sh" -nt initramfs.cpio.gz ||
  "$0" -nt initramfs.cpio.gz ]]; then
  log "building the initramfs"
  rm -rf initramfs && mkdir -p initramfs/{bin,dev,proc,sys,host,out,modules}
  cp /bin/busybox initramfs/bin/busybox
  for module in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -d kernel -S "$KVER" --show-depends "$module" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' >initramfs/modules/order
  while read -r ko; do
    cp "$ko" initramfs/modules/
  done <initramfs/modules/order
  sed -i 's|.*/||' initramfs/modules/order
  cp "$HERE/guest-init.sh" initramfs/init
  chmod +x initramfs/init
  (cd initramfs && find . | cpio -o -H newc --quiet | gzip -1) >initramfs.cpio.gz
fi
echo "$CACHE"
