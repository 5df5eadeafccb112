#!/bin/bash
# The real node's init, run inside the VM node (test/e2e-vm/run-vm.sh with a writable overlay
# root and the API network) as root: it makes the guest a Kubernetes node and keeps it one until
# the host asks it to stop. What it runs is what a node runs: containerd 2 with runc and Debian's
# CNI plugins, the kubelet with its node credentials, and nothing of vfio-dra: the plugin comes as
# the DaemonSet's pod, from its image, once the node registers.
#
# It reads its settings from /run/out/node.env (written by run.py): NODE_DIR (configuration made
# on the host), KUBE_BIN and RUNTIME_BIN (the binaries' directories), IMAGES (archives to import).
# It writes /run/out/node-ready once containerd and the kubelet run, and ends when /run/out/stop
# appears (the host's file, seen through the shared results directory), copying the node's logs
# to /run/out/logs/.
set -uo pipefail
if ! grep -q 'vfio_dra.run=' /proc/cmdline; then
  echo "guest-node.sh runs only inside the VM node (test/e2e-vm/run-vm.sh)" >&2
  exit 2
fi
OUT=/run/out
. "$OUT/node.env"
CACHE=$(cat "$OUT/cache-dir")
KVER=$(cat "$OUT/kernel-version")
LOGS=$OUT/logs
mkdir -p "$LOGS"
log() { echo "guest-node: $(date -u +%H:%M:%S.%N | cut -c1-12) $*"; }
fail() {
  log "FAIL $*"
  echo "$*" >"$OUT/node-failed"
  exit 1
}

# The guest kernel's modules come from the cache (its /lib/modules is the host's): load up front
# what the kernel would otherwise ask a modprobe for that is not in the guest's init.
modules=(virtio_net vfio_pci vfio_iommu_type1 mdev e1000e nvme snd_hda_intel bridge veth br_netfilter
  nf_tables nft_compat nft_chain_nat nf_nat nf_conntrack xt_MASQUERADE xt_nat xt_comment
  xt_mark xt_addrtype xt_conntrack xt_multiport xt_tcpudp nft_ct nft_nat nft_masq
  iptable_nat iptable_filter ip_tables)
for m in "${modules[@]}"; do
  modprobe -d "$CACHE/kernel" -S "$KVER" "$m" 2>>"$LOGS/modprobe.log" ||
    log "module $m not loaded ($LOGS/modprobe.log)"
done
# The sample mdev driver (built by prepare-vm.sh) stands in for a vGPU's parent.
insmod "$CACHE/mtty/mtty.ko" || fail "insmod mtty.ko failed"
# The node's tools ask the kernel's module tree by the running kernel's name.
mkdir -p /lib/modules
ln -sfn "$CACHE/kernel/lib/modules/$KVER" "/lib/modules/$KVER"

# The node's network: QEMU's user network, which forwards only 10.0.2.100:6443 (the API server).
IF=$(ip -o link | awk -F': ' '/52:54:00:00:00:10/ {print $2}')
[[ -n "$IF" ]] || fail "no virtio NIC with MAC 52:54:00:00:00:10 (run-vm.sh without VFIO_DRA_VM_API_PORT?)"
ip addr add 10.0.2.15/24 dev "$IF"
ip link set "$IF" up
ip route add default via 10.0.2.2
echo 1 >/proc/sys/net/ipv4/ip_forward
# The kube-proxy stand-in: the `kubernetes` Service's ClusterIP leads to the API server, as
# kube-proxy's rules would make it (no other Service is used).
iptables -t nat -A OUTPUT -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.0.2.100:6443 ||
  fail "cannot add the kubernetes Service rule (iptables)"
iptables -t nat -A PREROUTING -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.0.2.100:6443

# cgroup v2 as the kubelet and runc want it, and shared mounts for the kubelet's volume mounts.
mount -t cgroup2 none /sys/fs/cgroup || fail "cannot mount cgroup2"
echo "+cpu +cpuset +io +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
mount --make-rshared /
# containerd's overlay snapshots and the kubelet's volumes must not sit on the overlay root
# (overlayfs refuses an overlayfs upper layer).
for d in /var/lib/containerd /var/lib/kubelet /var/log/pods /var/run/cdi /etc/cni/net.d; do
  mkdir -p "$d"
done
mount -t tmpfs -o mode=0700 tmpfs /var/lib/containerd
mount -t tmpfs -o mode=0755 tmpfs /var/lib/kubelet
mount --make-rshared /var/lib/kubelet
cp "$NODE_DIR/10-pods.conflist" /etc/cni/net.d/
mkdir -p /opt/cni && ln -sfn /usr/lib/cni /opt/cni/bin
echo "vm-node" >/proc/sys/kernel/hostname

# AppArmor enforcing, as on a Debian or Ubuntu node: with securityfs mounted containerd confines
# every container (its default profile for the test's pods), and the plugin's own profile
# (deploy/apparmor, copied by run.py) is loaded as the node's provisioning would load it. The
# kernel's parameter says whether AppArmor is on (Debian's kernel turns it on by default).
mountpoint -q /sys/kernel/security || mount -t securityfs securityfs /sys/kernel/security ||
  fail "cannot mount securityfs"
[[ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" == Y ]] ||
  fail "AppArmor is not enabled in the node's kernel (/sys/module/apparmor/parameters/enabled)"
apparmor_parser --replace --skip-cache "$NODE_DIR/apparmor/vfio-dra-plugin" \
  >"$LOGS/apparmor.log" 2>&1 || fail "apparmor_parser: $(tail -3 "$LOGS/apparmor.log")"
grep -q '^vfio-dra-plugin (enforce)$' /sys/kernel/security/apparmor/profiles ||
  fail "the profile vfio-dra-plugin is not loaded in enforce mode"
log "AppArmor: $(grep -c . /sys/kernel/security/apparmor/profiles) profiles loaded, vfio-dra-plugin enforcing"

PATH=$RUNTIME_BIN:$KUBE_BIN:$PATH
export PATH
# Started again on the host's request ($OUT/restart-containerd, soak.py's fault): the running
# containers' shims outlive it, as on a node whose containerd is restarted.
start_containerd() {
  containerd --config "$NODE_DIR/containerd.toml" >>"$LOGS/containerd.log" 2>&1 &
  containerd_pid=$!
  for _ in $(seq 600); do
    [[ -S /run/containerd/containerd.sock ]] && ctr version >/dev/null 2>&1 && break
    kill -0 "$containerd_pid" 2>/dev/null || fail "containerd exited: $(tail -5 "$LOGS/containerd.log")"
    sleep 0.2
  done
  ctr version >/dev/null 2>&1 || fail "containerd did not answer within 120 s"
}
start_containerd
log "containerd up: $(ctr version | awk '/Version/ {print $2; exit}')"
for archive in $IMAGES; do
  ctr -n k8s.io images import --no-unpack=false "$archive" >>"$LOGS/images.log" 2>&1 ||
    fail "ctr images import $archive: $(tail -3 "$LOGS/images.log")"
done
ctr -n k8s.io images ls -q >>"$LOGS/images.log"
log "images: $(ctr -n k8s.io images ls -q | tr '\n' ' ')"

start_kubelet() {
  kubelet --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
    --hostname-override vm-node --node-ip 10.0.2.15 --node-labels vfio-dra.io/enabled=true \
    --v 2 >>"$LOGS/kubelet.log" 2>&1 &
  kubelet_pid=$!
  echo "$kubelet_pid" >"$OUT/kubelet.pid"
}
: >"$LOGS/kubelet.log"
start_kubelet
log "kubelet started (pid $kubelet_pid)"
# A kubelet that exits unasked is started again 10 s later, as systemd does for kubeadm's
# kubelet.service (Restart=always, RestartSec=10): a kubelet starting while containerd restarts
# exits at once ("get remote runtime typed version failed"). Each such exit is appended to
# $OUT/kubelet-exits, which the host treats as a failure unless its scenario allows it.
kubelet_down_since=
touch "$OUT/node-ready"

# The host drives the scenario through the API server. It may also ask for what an admin on the
# node would do or look at: a script in $OUT/cmd/NAME.sh runs here, its output goes to
# NAME.out and its exit code, last, to NAME.rc; $OUT/restart-kubelet restarts the kubelet and
# $OUT/restart-containerd containerd (each answered by $OUT/kubelet-restarted or
# $OUT/containerd-restarted once the new process runs).
mkdir -p "$OUT/cmd"
while [[ ! -e "$OUT/stop" ]]; do
  for script in "$OUT"/cmd/*.sh; do
    [[ -e "$script" && ! -e "${script%.sh}.rc" ]] || continue
    bash "$script" >"${script%.sh}.out" 2>&1
    # Renamed into place: the host reads NAME.rc as soon as it exists, and a redirect creates it
    # empty before it writes the code (an empty file read as a failure once, with the output
    # "present" of a passing check).
    echo $? >"${script%.sh}.rc.tmp"
    mv "${script%.sh}.rc.tmp" "${script%.sh}.rc"
  done
  if [[ -e "$OUT/restart-kubelet" ]]; then
    rm -f "$OUT/restart-kubelet"
    kill "$kubelet_pid" 2>/dev/null
    wait "$kubelet_pid"
    kubelet_down_since=
    start_kubelet
    log "kubelet restarted (pid $kubelet_pid)"
    touch "$OUT/kubelet-restarted"
  fi
  if [[ -e "$OUT/restart-containerd" ]]; then
    rm -f "$OUT/restart-containerd"
    kill "$containerd_pid"
    wait "$containerd_pid"
    start_containerd
    log "containerd restarted (pid $containerd_pid)"
    touch "$OUT/containerd-restarted"
  fi
  if [[ -z "$kubelet_down_since" ]] && ! kill -0 "$kubelet_pid" 2>/dev/null; then
    wait "$kubelet_pid"
    status=$?
    kubelet_down_since=$SECONDS
    echo "$(date -u +%T) the kubelet exited ($status): $(tail -1 "$LOGS/kubelet.log")" \
      >>"$OUT/kubelet-exits"
    log "the kubelet exited ($status); starting it again in 10 s"
  elif [[ -n "$kubelet_down_since" ]] && ((SECONDS - kubelet_down_since >= 10)); then
    kubelet_down_since=
    start_kubelet
    log "kubelet started again (pid $kubelet_pid)"
  fi
  sleep 0.5
done
log "stopping"
kill "$kubelet_pid" 2>/dev/null
wait "$kubelet_pid"
cp -r /var/log/pods "$LOGS/pods" 2>/dev/null
kill "$containerd_pid" 2>/dev/null
wait "$containerd_pid"
log "stopped"
exit 0
