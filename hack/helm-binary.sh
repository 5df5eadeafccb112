#!/usr/bin/env bash
# Builds helm for the chart's tests from its Go module (test/cluster/components/helm-4, go.sum
# committed) through the Go module proxy, as hack/kube-binaries.sh builds the Kubernetes
# components; prints the path of the binary. Cached under ~/.cache/vfio-dra/helm/VERSION/ (about
# 3 minutes the first time on 2 cores, then nothing). VFIO_DRA_KUBE_CACHE overrides the cache root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wrapper=$root/test/cluster/components/helm-4
script=helm-binary.sh
. "$root/hack/go-wrapper-env.sh"
version=$(pinned "$wrapper/go.mod" helm.sh/helm/v4)
if [ -z "$version" ]; then
  echo "helm-binary.sh: cannot read the pinned helm version from $wrapper/go.mod" >&2
  exit 1
fi
out=$cache/helm/$version
stamp=$(cat "$wrapper/go.mod" "$wrapper/go.sum" "$0" "$root/hack/go-wrapper-env.sh" | sha256sum |
  cut -c1-16)
if [ -x "$out/helm" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out/helm"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"
download_modules "$wrapper" "$out/download.log" "the chart tests need it"
# As helm's Makefile stamps a release, so that `helm version` reports it.
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version"
(cd "$wrapper" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/helm" \
  helm.sh/helm/v4/cmd/helm)
echo "$stamp" >"$out/.stamp"
echo "$out/helm"
