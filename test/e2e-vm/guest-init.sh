#!/bin/busybox sh
# Init of the real-kernel VM node. Mounts the host's file system read-only (9p tag "host") and a
# writable results directory (tag "out"), then runs the program given on the kernel command line
# (vfio_dra.run=<path on the host>) in a chroot of the host's file system, with the guest's
# /proc, /sys and /dev, a tmpfs /run, and the results directory at /run/out. With
# vfio_dra.root=overlay on the command line the chroot is writable (changes stay in memory). Its output goes to
# /run/out/guest.log and its exit code to /run/out/exit-code; then the VM powers off.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Loopback only: the API server stand-in listens on 127.0.0.1; the VM has no network device.
ip link set lo up
while read -r ko; do insmod "/modules/$ko" || echo "guest-init: insmod $ko failed"; done </modules/order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose host /host
mount -t 9p -o trans=virtio,version=9p2000.L,rw out /out
ROOT=/host
# vfio_dra.root=overlay: a writable root for the real node (kubelet and containerd write under
# /var and /etc): the host's files below, the changes in the guest's memory, none on the host.
if grep -q 'vfio_dra\.root=overlay' /proc/cmdline; then
  mkdir -p /rw /merged
  mount -t tmpfs -o mode=0755 tmpfs /rw
  mkdir -p /rw/upper /rw/work
  mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /merged
  ROOT=/merged
fi
for d in proc sys dev; do mount --bind "/$d" "$ROOT/$d"; done
mount -t tmpfs -o mode=0755 tmpfs "$ROOT/run"
mkdir -p "$ROOT/run/out"
mount --bind /out "$ROOT/run/out"
RUN=$(sed -n 's/.*vfio_dra\.run=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "guest-init: running $RUN"
if [ "$ROOT" = /merged ]; then
  # The real node's root is moved onto /, as switch_root does, so that the kernel names its files
  # as a node's (/etc/..., not /merged/etc/...): AppArmor matches profiles' rules against those
  # names. This init keeps its own root (the initramfs), where /out still is.
  cd /merged && mount -o move . / && ROOT=.
fi
chroot "$ROOT" /bin/sh -c "cd / && exec $RUN" >/out/guest.log 2>&1
echo $? >/out/exit-code
sync
poweroff -f
