#!/usr/bin/env bash
# Builds (or finds in the cache) everything the real node runs, so that the scenario's own time
# is the node's: the kubelet with the control plane of the release (hack/kube-binaries.sh), the
# container runtime (hack/node-runtime-binaries.sh) and the local images (images.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/../../hack/kube-binaries.sh" "${1:-1.37}" --with-kubelet
"$HERE/../../hack/node-runtime-binaries.sh"
"$HERE/images.sh"
