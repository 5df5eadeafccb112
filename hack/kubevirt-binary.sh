#!/usr/bin/env bash
# Builds kubevirt-vmi, KubeVirt's own handling of a VMI's DRA devices for the tests (its VMI schema
# and admission checks for test/cluster's examples check; virt-launcher's reading of the metadata
# files for test/real-node's pods): test/cluster/components/kubevirt-1.9, our program on KubeVirt's
# packages (go.sum committed), through the Go module proxy as hack/kube-binaries.sh builds the
# Kubernetes components; and the VirtualMachineInstance CRD with the schema of that KubeVirt
# release. Prints the directory that holds kubevirt-vmi and vmi-crd.yaml. Cached under
# ~/.cache/vfio-dra/kubevirt/VERSION/ (about 2 minutes the first time on 2 cores, then nothing).
# VFIO_DRA_KUBE_CACHE overrides the cache root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wrapper=$root/test/cluster/components/kubevirt-1.9
script=kubevirt-binary.sh
. "$root/hack/go-wrapper-env.sh"
version=$(pinned "$wrapper/go.mod" kubevirt.io/kubevirt)
if [ -z "$version" ]; then
  echo "kubevirt-binary.sh: cannot read the pinned KubeVirt version from $wrapper/go.mod" >&2
  exit 1
fi
out=$cache/kubevirt/$version
stamp=$(cat "$wrapper/go.mod" "$wrapper/go.sum" "$wrapper/main.go" "$0" \
  "$root/hack/go-wrapper-env.sh" | sha256sum | cut -c1-16)
if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"
download_modules "$wrapper" "$out/download.log" "the cluster tests' examples check needs it"
(cd "$wrapper" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
  -o "$out/kubevirt-vmi" .)
source_dir=$(cd "$wrapper" && go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
"$out/kubevirt-vmi" crd --kubevirt-source "$source_dir" >"$out/vmi-crd.yaml.new"
mv "$out/vmi-crd.yaml.new" "$out/vmi-crd.yaml"
check_built "$out" kubevirt-vmi
echo "$stamp" >"$out/.stamp"
echo "$out"
