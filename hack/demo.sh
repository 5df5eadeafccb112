#!/usr/bin/env bash
# vfio-dra demo: installs what is missing, builds, and runs the plugin daemon against the
# kubelet and API-server stand-ins on this machine, showing what the kubelet sees.
# Nothing here touches this machine's /sys: the daemon gets an empty simulated sysfs root.
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

step "Starting a loopback API server with two allocated ResourceClaims"
mkfifo "$WORK/api.out"
"$BIN/test/fake-apiserver" --kubeconfig-dir "$WORK" --claims hack/demo/claims.json \
  --node demo-node:6f1f0d7e-demo >"$WORK/api.out" 2>&1 &
PIDS+=($!)
read -r KUBECONFIG_PATH <"$WORK/api.out"
echo "kubeconfig: $KUBECONFIG_PATH"

step "A simulated vGPU node (fake sysfs: a Tesla T4 that is an mdev parent, one vGPU in use)"
"$BIN/test/make-fixture" vgpu "$WORK/node" >/dev/null
"$BIN/src/vfio-dra-plugin" discover --sysfs-root "$WORK/node/sys" --pci-ids "$WORK/node/pci.ids"

step "Starting vfio-dra-plugin serve on that node"
mkdir -p "$WORK/dev"
"$BIN/src/vfio-dra-plugin" serve --node-name demo-node --kubeconfig "$KUBECONFIG_PATH" \
  --registrar-dir "$WORK/plugins_registry" --plugin-data-dir "$WORK/plugins/vfio.dra.io" \
  --cdi-dir "$WORK/cdi" --sysfs-root "$WORK/node/sys" --pci-ids "$WORK/node/pci.ids" \
  --dev-root "$WORK/dev" 2>"$WORK/plugin.log" &
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

step "NodePrepareResources for a passthrough GPU claim"
echo "(device preparation lands with the vfio issue; until then the plugin refuses clearly)"
"$BIN/test/kubelet-sim" prepare --registrar-dir "$WORK/plugins_registry" \
  --claim vms/gpu-claim/5d7e1c0a-0000-4000-8000-000000000001 || true

step "NodeUnprepareResources"
"$BIN/test/kubelet-sim" unprepare --registrar-dir "$WORK/plugins_registry" \
  --claim vms/gpu-claim/5d7e1c0a-0000-4000-8000-000000000001 \
  --claim vms/nic-claim/5d7e1c0a-0000-4000-8000-000000000002

step "SIGTERM: the plugin removes its sockets and leaves ResourceSlices in place"
kill -TERM "$PLUGIN"
wait "$PLUGIN" && echo "exit code 0"
ls -A "$WORK/plugins_registry" "$WORK/plugins/vfio.dra.io" | sed 's/^/  /'

step "The plugin's log"
sed 's/^/  /' "$WORK/plugin.log"
