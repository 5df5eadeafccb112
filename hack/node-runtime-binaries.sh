#!/usr/bin/env bash
# Builds the container runtime of the real node (a real kubelet in the QEMU guest) from source,
# through the Go module proxy, as hack/kube-binaries.sh builds the Kubernetes components:
# containerd, containerd-shim-runc-v2 and ctr of github.com/containerd/containerd/v2 at the release
# pinned in test/cluster/components/containerd-2/go.mod, and runc at the release pinned in
# test/cluster/components/runc-1.4/go.mod. Nothing else is downloaded: no release binaries.
#   hack/node-runtime-binaries.sh    prints the directory that holds containerd,
#                                    containerd-shim-runc-v2, ctr and runc
# Never run them on the host: they are for the QEMU guest.
# containerd and its shim are built without cgo (so without the btrfs snapshotter), with the
# shim's no_grpc tag, as upstream's Makefile builds them; runc with cgo and libseccomp (Debian's
# libseccomp-dev and pkg-config, hack/install-deps.sh), linked statically like upstream's release
# binaries (`make static`), so it needs no library in the guest.
# The binaries are cached under ~/.cache/vfio-dra/node-runtime/CONTAINERD-RUNC/ (rebuilt only when
# a wrapper's go.mod/go.sum or this script change), Go's module and build caches under
# ~/.cache/vfio-dra/go/. Measured on 2 cores: the first build 4.5 minutes from empty caches
# (modules downloaded too), 3 minutes with the Go caches that hack/kube-binaries.sh left; a
# second run 0.04 s.
# VFIO_DRA_KUBE_CACHE overrides the cache root (default ~/.cache/vfio-dra).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ne 0 ]; then
  echo "usage: hack/node-runtime-binaries.sh (no arguments; prints the output directory)" >&2
  exit 2
fi
containerd_wrapper=$root/test/cluster/components/containerd-2
runc_wrapper=$root/test/cluster/components/runc-1.4
for w in "$containerd_wrapper" "$runc_wrapper"; do
  if [ ! -f "$w/go.mod" ] || [ ! -f "$w/go.sum" ]; then
    echo "node-runtime-binaries.sh: the wrapper module $w (go.mod and go.sum) is missing" >&2
    exit 2
  fi
done
script=node-runtime-binaries.sh
. "$root/hack/go-wrapper-env.sh"
containerd_version=$(pinned "$containerd_wrapper/go.mod" github.com/containerd/containerd/v2)
runc_version=$(pinned "$runc_wrapper/go.mod" github.com/opencontainers/runc)
if [ -z "$containerd_version" ] || [ -z "$runc_version" ]; then
  echo "node-runtime-binaries.sh: cannot read the pinned versions from $containerd_wrapper/go.mod" \
    "and $runc_wrapper/go.mod" >&2
  exit 1
fi
out=$cache/node-runtime/containerd-$containerd_version-runc-$runc_version
stamp=$(cat "$containerd_wrapper/go.mod" "$containerd_wrapper/go.sum" "$runc_wrapper/go.mod" \
  "$runc_wrapper/go.sum" "$0" "$root/hack/go-wrapper-env.sh" | sha256sum | cut -c1-16)
bins="containerd containerd-shim-runc-v2 ctr runc"
if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
  echo "$out"
  exit 0
fi

# runc's seccomp support links libseccomp through pkg-config: say so before a cgo error does.
if ! command -v pkg-config >/dev/null || ! pkg-config --exists libseccomp ||
  [ ! -f "$(pkg-config --variable=libdir libseccomp)/libseccomp.a" ]; then
  echo "node-runtime-binaries.sh: runc needs libseccomp-dev and pkg-config (run hack/install-deps.sh)" >&2
  exit 1
fi
mkdir -p "$out"
rm -f "$out/.stamp"

start=$(date +%s)
download_modules "$containerd_wrapper" "$out/download.log" "the real node needs it"
download_modules "$runc_wrapper" "$out/download.log" "the real node needs it"

jobs=$(nproc)
echo "node-runtime-binaries.sh: building containerd $containerd_version and runc $runc_version" \
  "into $out" >&2
# As upstream's Makefile builds a release: the version stamped so that `containerd --version`
# reports it (the revision is not known without the git tree), -s -w, urfave_cli_no_docs, and
# the shim without gRPC (it speaks ttrpc only).
pkg=github.com/containerd/containerd/v2
ldflags="-s -w -X $pkg/version.Version=$containerd_version -X $pkg/version.Package=$pkg"
(cd "$containerd_wrapper" && CGO_ENABLED=0 go build -p "$jobs" -trimpath -tags urfave_cli_no_docs \
  -ldflags "$ldflags" -o "$out/" "$pkg/cmd/containerd" "$pkg/cmd/ctr")
(cd "$containerd_wrapper" && CGO_ENABLED=0 go build -p "$jobs" -trimpath \
  -tags "urfave_cli_no_docs no_grpc" -ldflags "$ldflags" -o "$out/containerd-shim-runc-v2" \
  "$pkg/cmd/containerd-shim-runc-v2")
# As runc's `make static`: cgo (libcontainer/nsenter), seccomp, a static PIE; the version comes
# from runc's embedded VERSION file.
(cd "$runc_wrapper" && CGO_ENABLED=1 go build -p "$jobs" -trimpath -buildmode=pie \
  -tags "seccomp urfave_cli_no_docs netgo osusergo" \
  -ldflags "-s -w -linkmode external -extldflags -static-pie" -o "$out/runc" \
  github.com/opencontainers/runc)
# shellcheck disable=SC2086 # $bins is a list of names
check_built "$out" $bins
echo "$stamp" >"$out/.stamp"
echo "node-runtime-binaries.sh: containerd $containerd_version and runc $runc_version built in" \
  "$(($(date +%s) - start)) s" >&2
echo "$out"
