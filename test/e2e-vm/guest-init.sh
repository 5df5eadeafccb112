#!/bin/busybox sh
# Init of the real-kernel VM node. Mounts the host's file system read-only (9p tag "host") and a
# writable results directory (tag "out"), then runs the program given on the kernel command line
# (vfio_dra.run=<path on the host>) in a chroot of the host's file system, with the guest's
# /proc, /sys and /dev, a tmpfs /run, and the results directory at /run/out. Its output goes to
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
for d in proc sys dev; do mount --bind "/$d" "/host/$d"; done
mount -t tmpfs -o mode=0755 tmpfs /host/run
mkdir -p /host/run/out
mount --bind /out /host/run/out
RUN=$(sed -n 's/.*vfio_dra\.run=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "guest-init: running $RUN"
chroot /host /bin/sh -c "cd / && exec $RUN" >/out/guest.log 2>&1
echo $? >/out/exit-code
sync
poweroff -f
