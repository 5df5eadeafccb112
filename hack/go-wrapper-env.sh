# Sourced by the scripts that build test tools from wrapper Go modules through the Go module proxy
# (kube-binaries.sh, helm-binary.sh, node-runtime-binaries.sh): Go from /usr/local/go, the module
# and build caches under the project's cache (VFIO_DRA_KUBE_CACHE, default ~/.cache/vfio-dra), the
# wrappers' committed go.sum as the only checksums (-mod=readonly), and `pinned`.
# Expects $script (the caller's name, for messages); sets $cache.
export PATH=/usr/local/go/bin:$PATH
if ! command -v go >/dev/null; then
  echo "$script: go is not installed (expected /usr/local/go/bin/go, Go >= 1.26)" >&2
  exit 1
fi
cache=${VFIO_DRA_KUBE_CACHE:-$HOME/.cache/vfio-dra}
export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOTOOLCHAIN=local
# A module the proxy serves differently from the committed go.sum fails the build.
export GONOSUMDB= GOFLAGS="-modcacherw -mod=readonly"

# The version of module $2 that the wrapper go.mod $1 pins (inside or outside a require block).
pinned() {
  awk -v m="$2" '($1 == m && $2 ~ /^v/) {print $2} ($1 == "require" && $2 == m) {print $3}' "$1"
}

# Downloads the modules of wrapper $1, logging to $2; when the proxy cannot serve them, names it as
# the reason (rather than a compiler error later) and exits. $3 says who needs them ("the cluster tests need it").
download_modules() {
  if ! (cd "$1" && go mod download -x >"$2" 2>&1); then
    echo "$script: downloading the modules of $1 from the Go module proxy" \
      "($(go env GOPROXY)) failed; $3 (last lines of $2):" >&2
    tail -5 "$2" >&2
    exit 1
  fi
}

# Exits with a message unless every binary named after $1 (the output directory) was built there.
check_built() {
  local dir=$1 b
  shift
  for b in "$@"; do
    if [ ! -x "$dir/$b" ]; then
      echo "$script: the build finished without $dir/$b" >&2
      exit 1
    fi
  done
}
