#!/usr/bin/env bash
# Builds the vfio-dra-plugin container image without Docker and without any registry but Debian's
# package archive, and writes it as an OCI archive that `skopeo copy` pushes anywhere:
#
#   ./hack/image.sh                      # -> build-image/vfio-dra-plugin-<version>.oci.tar
#   skopeo copy oci-archive:build-image/vfio-dra-plugin-0.1.0.oci.tar \
#     docker://registry.example.com/vfio-dra/vfio-dra-plugin:0.1.0
#
# Two layers: a Debian 12 root file system made by mmdebstrap from the Essential packages plus
# exactly the Dockerfile's runtime package list (its runtime-packages block is the one list; the
# CTest image_runtime_packages checks it against `ldd`), and the plugin binary at
# /usr/bin/vfio-dra-plugin. The base layer is cached under ~/.cache/vfio-dra/image keyed by the
# package list and the mmdebstrap command, the finished archive by that key and the binary's hash;
# --refresh rebuilds the base (to pick up Debian security updates).
#
# Options:
#   --binary FILE   put this plugin binary in the image (debug info is stripped); default: build
#                   it in build-image/ (RelWithDebInfo, as the Dockerfile does, no tests)
#   --output FILE   where to write the OCI archive
#   --refresh       rebuild the cached base layer
# Writes next to the archive: <archive>.packages (the image's Debian packages and versions) and
# <archive>.size (compressed and unpacked sizes). Needs root (mmdebstrap installs packages in a
# chroot); installs mmdebstrap, umoci and skopeo from Debian when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BINARY="" OUTPUT="" REFRESH=0
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY=$(realpath "$2"); shift 2 ;;
    --output) OUTPUT=$(realpath -m "$2"); shift 2 ;;
    --refresh) REFRESH=1; shift ;;
    *) echo "image.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "image.sh: run as root: mmdebstrap builds the root file system in a chroot" >&2
  exit 1
fi

log() { printf 'image.sh: %s\n' "$*" >&2; }

TOOLS=(mmdebstrap umoci skopeo)
missing=()
for p in "${TOOLS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ -z "$BINARY" ]; then
  log "building the plugin (RelWithDebInfo, no tests) in build-image/"
  ./hack/install-deps.sh --build-only
  BUILD_DIR=build-image ./hack/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DVFIO_DRA_BUILD_TESTS=OFF
  BINARY=$ROOT/build-image/src/vfio-dra-plugin
fi
[ -x "$BINARY" ] || { log "no plugin binary at $BINARY"; exit 1; }
VERSION=$("$BINARY" version | awk '{print $NF; exit}')
OUTPUT=${OUTPUT:-$ROOT/build-image/vfio-dra-plugin-$VERSION.oci.tar}
mkdir -p "$(dirname "$OUTPUT")"

mapfile -t PACKAGES < <(python3 test/image/check_runtime_packages.py --list Dockerfile)
SOURCES=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
# The container needs no documentation; copyright files stay (the licenses of what we ship).
# merged-usr sets up the /usr merge without installing usrmerge (and the perl it pulls in).
MMDEBSTRAP=(mmdebstrap --variant=essential "--include=$(IFS=,; echo "${PACKAGES[*]}")"
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  bookworm - "${SOURCES[@]}")

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/vfio-dra/image
BASE_KEY=$(printf '%s\n' "${MMDEBSTRAP[@]}" | sha256sum | cut -c1-16)
BASE=$CACHE/base-$BASE_KEY
STRIPPED_HASH=""
WORK=$(mktemp -d /tmp/vfio-dra-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
strip --strip-debug -o "$WORK/vfio-dra-plugin" "$BINARY"
STRIPPED_HASH=$(sha256sum "$WORK/vfio-dra-plugin" | cut -c1-16)
FINAL=$CACHE/final-$BASE_KEY-$STRIPPED_HASH.oci.tar

# The base layer: an OCI layout holding only the root file system, and its package list.
if [ "$REFRESH" = 1 ] || [ ! -f "$BASE/done" ]; then
  rm -rf "$BASE" && mkdir -p "$BASE"
  log "building the Debian 12 root file system with mmdebstrap (Essential + ${#PACKAGES[@]}" \
    "runtime packages; about a minute, most of it downloading about 35 MB)"
  started=$(date +%s)
  # Device nodes stay out of the layer: the container runtime makes /dev. mmdebstrap's own
  # progress lines (I:/W:/E:) are shown as it goes; its whole log only when it fails.
  if ! SOURCE_DATE_EPOCH=$(date -u -d 2025-01-01 +%s) "${MMDEBSTRAP[@]}" \
    2> >(tee "$WORK/mmdebstrap.log" | grep --line-buffered -E '^[IWE]:' | sed 's/^/  /' >&2) |
    mmtarfilter --path-exclude='/dev/*' >"$WORK/rootfs.tar"; then
    log "mmdebstrap failed; its log:"
    tail -n 40 "$WORK/mmdebstrap.log" >&2
    exit 1
  fi
  log "root file system built in $(($(date +%s) - started)) s: $(du -m "$WORK/rootfs.tar" | cut -f1) MB"
  mkdir "$WORK/status"
  tar -xOf "$WORK/rootfs.tar" ./var/lib/dpkg/status >"$WORK/status/status"
  dpkg-query --admindir="$WORK/status" -W -f='${Package} ${Version}\n' | sort >"$BASE/packages"
  du -b "$WORK/rootfs.tar" | cut -f1 >"$BASE/unpacked-bytes"
  umoci init --layout "$BASE/oci"
  umoci new --image "$BASE/oci:base"
  umoci raw add-layer --image "$BASE/oci:base" "$WORK/rootfs.tar" \
    --history.created_by="mmdebstrap --variant=essential: Debian 12 + ${PACKAGES[*]}"
  touch "$BASE/done"
  # Keep the two newest bases and five newest images: the cache must not grow without bound.
  ls -dt "$CACHE"/base-* | tail -n +3 | xargs -r rm -rf
else
  log "reusing the cached root file system $BASE (--refresh rebuilds it)"
fi

if [ ! -f "$FINAL" ]; then
  log "adding the plugin ($(du -m "$WORK/vfio-dra-plugin" | cut -f1) MB) as the second layer"
  cp -a "$BASE/oci" "$WORK/oci"
  mkdir -p "$WORK/plugin-layer/usr/bin"
  install -m 0755 "$WORK/vfio-dra-plugin" "$WORK/plugin-layer/usr/bin/vfio-dra-plugin"
  tar --owner=0 --group=0 --numeric-owner --sort=name --mtime=@0 -C "$WORK/plugin-layer" \
    -cf "$WORK/plugin.tar" usr
  umoci raw add-layer --image "$WORK/oci:base" --tag "$VERSION" "$WORK/plugin.tar" \
    --history.created_by="vfio-dra-plugin $VERSION at /usr/bin/vfio-dra-plugin"
  umoci config --image "$WORK/oci:$VERSION" --os linux --architecture amd64 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.entrypoint /usr/bin/vfio-dra-plugin --config.cmd serve --config.workingdir / \
    --config.label org.opencontainers.image.title=vfio-dra-plugin \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label org.opencontainers.image.base.name=debian:12
  umoci rm --image "$WORK/oci:base"
  umoci gc --layout "$WORK/oci"
  # The archive names the image as the DaemonSet does (`podman load` then finds it as that).
  skopeo copy --quiet "oci:$WORK/oci:$VERSION" \
    "oci-archive:$WORK/image.oci.tar:vfio-dra-plugin:$VERSION"
  mv "$WORK/image.oci.tar" "$FINAL"
  ls -t "$CACHE"/final-*.oci.tar | tail -n +6 | xargs -r rm -f
else
  log "reusing the cached image $FINAL"
fi

cp "$FINAL" "$OUTPUT"
cp "$BASE/packages" "$OUTPUT.packages"
compressed=$(du -b "$OUTPUT" | cut -f1)
unpacked=$(($(cat "$BASE/unpacked-bytes") + $(du -b "$WORK/vfio-dra-plugin" | cut -f1)))
printf 'compressed %d MB (the archive), unpacked %d MB, %d Debian packages\n' \
  $((compressed / 1000000)) $((unpacked / 1000000)) "$(wc -l <"$OUTPUT.packages")" \
  | tee "$OUTPUT.size" >&2
skopeo inspect --format 'image.sh: {{.Digest}} ({{len .Layers}} layers)' "oci-archive:$OUTPUT" >&2
echo "$OUTPUT"
