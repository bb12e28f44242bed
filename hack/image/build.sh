#!/usr/bin/env bash
# `make image`: the driver's image built without Docker and without a registry.
#  1. a base image made locally: debootstrap of Debian bookworm (minbase + python3, python3-venv,
#     ca-certificates), imported with `podman import`, cached by its package list;
#  2. `podman build` of the repository's Dockerfile with BASE set to that image (the Dockerfile's
#     default, python:3.11-slim, stays for users with Docker);
#  3. `podman save` as an OCI archive in the cache, and, when `hami-dra cluster up` is running, an
#     import into its containerd (`ctr -n k8s.io images import`) so pods can use it.
# Cache: ${HAMI_DRA_CACHE:-~/.cache/hami-dra}/image/. Needs root, podman, runc, debootstrap.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${HAMI_DRA_CACHE:-$HOME/.cache/hami-dra}/image"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)"
image="localhost/hami-dra:$version"
packages="python3,python3-venv,ca-certificates"
base_key="bookworm-$(printf '%s' "$packages" | sha256sum | cut -c1-12)"
base="localhost/hami-dra-base:$base_key"
log() { printf '%s image: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if ! command -v debootstrap >/dev/null && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || { echo "image: $tool is required (apt-get install podman runc debootstrap)" >&2; exit 1; }
done
mkdir -p "$cache"
conf="$cache/containers.conf"
cat > "$conf" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$conf"
podman=(podman --root "$cache/storage" --runroot "$cache/run" --tmpdir "$cache/tmp" --storage-driver vfs)
mkdir -p "$cache/tmp"
started=$SECONDS

if ! "${podman[@]}" image exists "$base"; then
  tarball="$cache/$base_key.rootfs.tar"
  if [ ! -f "$tarball" ]; then
    log "debootstrap of Debian bookworm ($packages) into the cache; takes minutes once"
    rootfs="$(mktemp -d "$cache/rootfs.XXXX")"
    debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
  fi
  log "importing the base image $base"
  "${podman[@]}" import "$tarball" "$base" >/dev/null
fi

log "building $image from the Dockerfile (BASE=$base)"
# The host's CA bundle is mounted for the build steps only (machines whose egress is re-signed by
# a proxy); nothing of it is stored in the image.
ca_mount=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  ca_mount=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
"${podman[@]}" build --network host "${ca_mount[@]}" --build-arg "BASE=$base" -t "$image" \
  -f "$repo/Dockerfile" "$repo" >&2
archive="$cache/hami-dra-$version.oci.tar"
rm -f "$archive"
"${podman[@]}" save --format oci-archive -o "$archive" "$image"
size="$("${podman[@]}" image inspect "$image" --format '{{.Size}}')"
log "built $image in $((SECONDS - started)) s: $((size / 1024 / 1024)) MiB; archive $archive"

state="${HAMI_DRA_CLUSTER_STATE:-/tmp/hami-dra-cluster-$(id -u)}"
if [ -S "$state/containerd/containerd.sock" ]; then
  ctr="$(ls "${HAMI_DRA_CACHE:-$HOME/.cache/hami-dra}"/containerd/v*/bin/ctr 2>/dev/null | head -1)"
  log "importing into the running cluster's containerd ($state)"
  "$ctr" --address "$state/containerd/containerd.sock" -n k8s.io images import "$archive" >/dev/null
fi
echo "image: $image"
echo "archive: $archive"
