#!/usr/bin/env bash
# The HAMi-core stand-in (standin.c) built as libvgpu.so, in an image laid out like HAMi's
# published one (projecthami/hami: /k8s-vgpu/lib/nvidia/libvgpu.so.<version>, from HAMi's
# docker/Dockerfile), for the chart's `kubeletPlugin.hamiCore.install: image` on machines without
# a GPU and without a registry (tests/cluster/test_hami_core.py).
#
#   hack/hami-core-standin/build.sh [VERSION]     # VERSION: the library's HAMi version, v2.10.0
#
# The image is built FROM the driver's image that `make image` built (hack/image/build.sh), in the
# same podman storage: the same debootstrapped bookworm rootfs and glibc the library is compiled
# against here, and layers containerd already holds. Its tag is the library's version plus a
# digest of the library and the base, so a rebuild happens only when either changed. Prints
# "image: <ref>" and "archive: <OCI archive>"; import it with
#   ctr --address <state>/containerd/containerd.sock -n k8s.io images import <archive>
# Needs root, gcc, podman, runc and `make image` done.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="${1:-v2.10.0}"
cache="${HAMI_DRA_CACHE:-$HOME/.cache/hami-dra}/image"
driver_version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)"
base="localhost/hami-dra:$driver_version"
log() { printf '%s hami-core-standin: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

case "$version" in
  v[0-9]*.[0-9]*.[0-9]*) ;;
  *) echo "hami-core-standin: VERSION must look like HAMi's tags (v2.10.0), not '$version'" >&2; exit 2 ;;
esac
for tool in gcc podman runc; do
  command -v "$tool" >/dev/null || { echo "hami-core-standin: $tool is required" >&2; exit 1; }
done

# The storage and settings hack/image/build.sh uses, so that its images are found here.
export CONTAINERS_CONF="$cache/containers.conf"
podman=(podman --root "$cache/storage" --runroot "$cache/run" --tmpdir "$cache/tmp" --storage-driver vfs)
if [ ! -f "$CONTAINERS_CONF" ] || ! "${podman[@]}" image exists "$base"; then
  echo "hami-core-standin: no $base in $cache: run \`make image\` first" >&2
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/hami-core-standin.XXXXXX")"
trap 'rm -rf "$work"' EXIT
gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o "$work/libvgpu.so" "$here/standin.c"
base_id="$("${podman[@]}" image inspect "$base" --format '{{.Id}}')"
digest="$( (sha256sum "$work/libvgpu.so" | cut -d' ' -f1; echo "$base_id") | sha256sum | cut -c1-12)"
image="localhost/hami-core-standin:$version-$digest"
archive="$cache/hami-core-standin-$version-$digest.oci.tar"

if [ ! -f "$archive" ]; then
  log "building $image from $base"
  cat > "$work/Containerfile" <<CONTAINERFILE
FROM $base
COPY libvgpu.so /k8s-vgpu/lib/nvidia/libvgpu.so.$version
LABEL version="$version"
ENTRYPOINT ["/bin/sh"]
CONTAINERFILE
  # vfs storage copies the whole rootfs per image: an older build of this version goes first.
  "${podman[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/hami-core-standin |
    { grep -F ":$version-" || true; } | while read -r old; do "${podman[@]}" rmi "$old" >/dev/null; done
  rm -f "$cache/hami-core-standin-$version-"*.oci.tar
  "${podman[@]}" build --network none -t "$image" -f "$work/Containerfile" "$work" >&2
  "${podman[@]}" save --format oci-archive -o "$archive.partial" "$image"
  mv "$archive.partial" "$archive"
fi
echo "image: $image"
echo "archive: $archive"
