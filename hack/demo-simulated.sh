#!/usr/bin/env bash
# vfio-dra demo without a VM: installs what is missing, builds, and runs the plugin daemon
# against the kubelet and API-server stand-ins on this machine, showing what the kubelet sees.
# Nothing here touches this machine's /sys: the daemon runs on a fake sysfs tree, with the test
# build's simulated kernel (vfio-dra-sim-daemon) reacting to its writes as the kernel would.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
./hack/install-deps.sh
./hack/build.sh >/dev/null
BIN=$ROOT/build
WORK=$(mktemp -d /tmp/vfio-dra-demo.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Starting a loopback API server with three allocated ResourceClaims"
mkfifo "$WORK/api.out"
"$BIN/test/fake-apiserver" --kubeconfig-dir "$WORK" --claims hack/demo/claims.json \
  --node demo-node:6f1f0d7e-demo >"$WORK/api.out" 2>&1 &
PIDS+=($!)
read -r KUBECONFIG_PATH <"$WORK/api.out"
echo "kubeconfig: $KUBECONFIG_PATH"

step "A simulated VM host (fake sysfs: a GPU with audio, a T4 for vGPUs, a NIC with 4 VFs)"
"$BIN/test/make-fixture" vm-host "$WORK/node" >/dev/null
"$BIN/src/vfio-dra-plugin" discover --sysfs-root "$WORK/node/sys" --pci-ids "$WORK/node/pci.ids"

step "Starting vfio-dra-plugin serve on that node (with the simulated kernel)"
mkdir -p "$WORK/dev"
"$BIN/test/vfio-dra-sim-daemon" serve --node-name demo-node --kubeconfig "$KUBECONFIG_PATH" \
  --registrar-dir "$WORK/plugins_registry" --plugin-data-dir "$WORK/plugins/vfio.dra.io" \
  --cdi-dir "$WORK/cdi" --sysfs-root "$WORK/node/sys" --pci-ids "$WORK/node/pci.ids" \
  --dev-root "$WORK/dev" --metrics-address 127.0.0.1:0 2>"$WORK/plugin.log" &
PLUGIN=$!
PIDS+=($PLUGIN)

step "The kubelet finds and registers the plugin"
"$BIN/test/kubelet-sim" register --registrar-dir "$WORK/plugins_registry"
ls -l "$WORK/plugins_registry" "$WORK/plugins/vfio.dra.io" | sed 's/^/  /'

step "The ResourceSlices it published (as kubectl would list them)"
python3 hack/demo/show_slices.py "$(sed -n 's/^ *server: //p' "$KUBECONFIG_PATH")" demo-node

step "NodePrepareResources for a claim of another driver (nothing for us to do)"
"$BIN/test/kubelet-sim" prepare --registrar-dir "$WORK/plugins_registry" \
  --claim vms/nic-claim/5d7e1c0a-0000-4000-8000-000000000002

drivers() {
  for f in 0000:01:00.0 0000:01:00.1; do
    printf '  %s -> %s\n' "$f" "$(basename "$(readlink "$WORK/node/sys/bus/pci/devices/$f/driver")")"
  done
}
step "NodePrepareResources for a passthrough GPU (template claim) and a vGPU"
drivers
"$BIN/test/kubelet-sim" prepare --registrar-dir "$WORK/plugins_registry" \
  --claim vms/vm1-gpu-x7k2p/5d7e1c0a-0000-4000-8000-000000000001 \
  --claim vms/vgpu-claim/5d7e1c0a-0000-4000-8000-000000000003
echo "The GPU and its audio function, now on vfio-pci:"
drivers
echo "The vGPU, created with its published UUID:"
ls "$WORK/node/sys/bus/mdev/devices" | sed 's/^/  /'
echo "CDI specs for the container runtime:"
ls "$WORK/cdi" | sed 's/^/  /'
python3 -m json.tool "$WORK/cdi/vfio.dra.io-vfio_5d7e1c0a-0000-4000-8000-000000000001.json" | sed 's/^/  /'
echo "The KubeVirt (KEP-5304) metadata file for the GPU request (its CDI spec mounts it where virt-launcher reads it):"
python3 -m json.tool "$WORK/plugins/vfio.dra.io/dra-device-metadata/5d7e1c0a-0000-4000-8000-000000000001_gpu.json" |
  sed 's/^/  /'

step "NodeUnprepareResources: everything goes back"
"$BIN/test/kubelet-sim" unprepare --registrar-dir "$WORK/plugins_registry" \
  --claim vms/vm1-gpu-x7k2p/5d7e1c0a-0000-4000-8000-000000000001 \
  --claim vms/vgpu-claim/5d7e1c0a-0000-4000-8000-000000000003 \
  --claim vms/nic-claim/5d7e1c0a-0000-4000-8000-000000000002
drivers
echo "CDI specs left: $(ls "$WORK/cdi" | wc -l); mdevs left: $(ls "$WORK/node/sys/bus/mdev/devices" | wc -l)"

step "SIGTERM: the plugin removes its sockets and leaves ResourceSlices in place"
kill -TERM "$PLUGIN"
wait "$PLUGIN" && echo "exit code 0"
ls -A "$WORK/plugins_registry" "$WORK/plugins/vfio.dra.io" | sed 's/^/  /'

step "The plugin's log"
sed 's/^/  /' "$WORK/plugin.log"
