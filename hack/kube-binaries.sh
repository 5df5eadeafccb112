#!/usr/bin/env bash
# Builds the real Kubernetes components the cluster tests run (test/cluster/), from source, through
# the Go module proxy: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet
# of k8s.io/kubernetes at the release pinned in test/cluster/components/kubernetes-MINOR/go.mod, and
# etcd 3.6 from test/cluster/components/etcd-3.6. Nothing else is downloaded: no release binaries,
# no images.
#   hack/kube-binaries.sh MINOR [--with-kubelet]
#                                    e.g. 1.37; prints the directory that holds the binaries; the
#                                    kubelet (for the real-node tests) only when asked, as it adds
#                                    a quarter to a first build
# The binaries are cached per release under ~/.cache/vfio-dra/kubernetes/VERSION/ (rebuilt only
# when the wrapper's go.mod/go.sum change), Go's module and build caches under
# ~/.cache/vfio-dra/go/, so a second run takes seconds and a rebuild after a go.mod change about a
# minute. The first build of a release takes 5-12 minutes on 2 cores (README, "Tests against a
# real control plane").
# VFIO_DRA_KUBE_CACHE overrides the cache root (default ~/.cache/vfio-dra).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minor=${1:-}
with_kubelet=0
case "${2:-}" in
  "") ;;
  --with-kubelet) with_kubelet=1 ;;
  *) echo "kube-binaries.sh: unknown argument '$2'" >&2; exit 2 ;;
esac
if [ -z "$minor" ]; then
  echo "usage: hack/kube-binaries.sh MINOR (one of:" \
    "$(cd "$root/test/cluster/components" && ls -d kubernetes-* | sed 's/kubernetes-//' | tr '\n' ' '))" >&2
  exit 2
fi
wrapper=$root/test/cluster/components/kubernetes-$minor
etcd_wrapper=$root/test/cluster/components/etcd-3.6
if [ ! -f "$wrapper/go.mod" ]; then
  echo "kube-binaries.sh: no wrapper module for Kubernetes $minor ($wrapper/go.mod is missing)" >&2
  exit 2
fi
script=kube-binaries.sh
. "$root/hack/go-wrapper-env.sh"
version=$(pinned "$wrapper/go.mod" k8s.io/kubernetes)
etcd_version=$(pinned "$etcd_wrapper/go.mod" go.etcd.io/etcd/server/v3)
if [ -z "$version" ] || [ -z "$etcd_version" ]; then
  echo "kube-binaries.sh: cannot read the pinned versions from $wrapper/go.mod and $etcd_wrapper/go.mod" >&2
  exit 1
fi
out=$cache/kubernetes/$version
stamp=$(cat "$wrapper/go.mod" "$wrapper/go.sum" "$etcd_wrapper/go.mod" "$etcd_wrapper/go.sum" "$0" \
  "$root/hack/go-wrapper-env.sh" |
  sha256sum | cut -c1-16)
components="kube-apiserver kube-controller-manager kube-scheduler kubectl"
[ "$with_kubelet" = 1 ] && components+=" kubelet"
bins="$components etcd"
stamp+="-$with_kubelet"
# A build with the kubelet serves a run without it.
if [ -f "$out/.stamp" ] && { [ "$(cat "$out/.stamp")" = "$stamp" ] ||
  [ "$(cat "$out/.stamp")" = "${stamp%-0}-1" ]; }; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"

start=$(date +%s)
download_modules "$wrapper" "$out/download.log" "the cluster tests need it"
download_modules "$etcd_wrapper" "$out/download.log" "the cluster tests need it"

# As upstream's hack/lib/golang.sh and hack/lib/version.sh build a release: -trimpath, these
# tags, and the version stamped so that /version and `kubectl version` report the release.
major=${version#v}; major=${major%%.*}
minor_num=${version#v*.}; minor_num=${minor_num%%.*}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=$major -X $p.gitMinor=$minor_num"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
done
tags=selinux,notest,grpcnotrace
jobs=$(nproc)
echo "kube-binaries.sh: building Kubernetes $version and etcd $etcd_version into $out" >&2
packages=()
for c in $components; do packages+=("k8s.io/kubernetes/cmd/$c"); done
(cd "$wrapper" && CGO_ENABLED=0 go build -p "$jobs" -trimpath -tags "$tags" -ldflags "$ldflags" \
  -o "$out/" "${packages[@]}")
(cd "$etcd_wrapper" && CGO_ENABLED=0 go build -p "$jobs" -trimpath -ldflags "-s -w" \
  -o "$out/etcd" go.etcd.io/etcd/server/v3)
# shellcheck disable=SC2086 # $bins is a list of names
check_built "$out" $bins
echo "$stamp" >"$out/.stamp"
echo "kube-binaries.sh: Kubernetes $version built in $(($(date +%s) - start)) s" >&2
echo "$out"
