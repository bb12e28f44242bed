#!/usr/bin/env bash
# Builds the upstream programs of the local real cluster (`hami-dra cluster up`) from their published
# Go modules into a cache outside the repository, keyed by component and version:
#   ${HAMI_DRA_CACHE:-~/.cache/hami-dra}/kubernetes/v<version>/bin/{kube-apiserver,...,kube-proxy,kubectl}
#   .../etcd/v<version>/bin/etcd   .../containerd/v<version>/bin/{containerd,containerd-shim-runc-v2,ctr}
#   .../cni-plugins/v<version>/bin/{bridge,loopback,host-local,portmap}   .../crictl/v<version>/bin/crictl
#   .../nvidia-container-toolkit/v<version>/bin/{nvidia-ctk,nvidia-cdi-hook}
# The modules that pin them are hack/cluster/go/*/go.mod (+ go.sum, checked by `go build`).
# A component whose directory is complete is skipped, so a warm run does nothing and takes a second.
# KUBERNETES_VERSION selects the Kubernetes module (default in hack/cluster/versions.env).
# Prints `bin: <dir>` for each component, which `hami-dra cluster` reads.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
. "$here/versions.env"
cache="${HAMI_DRA_CACHE:-$HOME/.cache/hami-dra}"
k8s_version="${KUBERNETES_VERSION:-$KUBERNETES_VERSION_DEFAULT}"
k8s_version="${k8s_version#v}"
only="${1:-all}"

command -v go >/dev/null || { echo "build.sh: Go is required (https://go.dev/dl); none on PATH" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false -trimpath"

log() { printf '%s build.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# program <package>: the file name go build gives a package's binary (etcd's is renamed below).
program() { case "$1" in go.etcd.io/etcd/server/v3) echo etcd ;; *) echo "${1##*/}" ;; esac; }

# build <component> <version> <module dir> <ldflags> <package>...
# A cached directory that lacks a program (a newer checkout pins one more) gets just that program.
build() {
  local component="$1" version="$2" moddir="$here/go/$3" ldflags="$4"; shift 4
  local dest="$cache/$component/v$version" missing=() pkg
  for pkg in "$@"; do
    [ -f "$dest/.complete" ] && [ -x "$dest/bin/$(program "$pkg")" ] || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "bin: $dest/bin"
    return 0
  fi
  [ -f "$moddir/go.mod" ] || { echo "build.sh: no module for $component $version ($moddir/go.mod); pinned versions are in hack/cluster/versions.env" >&2; exit 1; }
  log "building $component v$version (${#missing[@]} of $# programs; the first build takes minutes, later runs reuse $dest)"
  local started=$SECONDS
  rm -rf "$dest.partial"
  if [ -f "$dest/.complete" ]; then cp -a "$dest" "$dest.partial"; else mkdir -p "$dest.partial/bin"; fi
  (cd "$moddir" && go build -ldflags "-s -w $ldflags" -o "$dest.partial/bin/" "${missing[@]}")
  # etcd's main package is its module root, go.etcd.io/etcd/server/v3, which go names "server".
  if [ "$component" = etcd ]; then mv "$dest.partial/bin/server" "$dest.partial/bin/etcd"; fi
  touch "$dest.partial/.complete"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  log "built $component v$version in $((SECONDS - started)) s"
  echo "bin: $dest/bin"
}

k8s_minor="${k8s_version#*.}"; k8s_minor="${k8s_minor%%.*}"
k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=v$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

want() { [ "$only" = all ] || [ "$only" = "$1" ]; }
want kubernetes && build kubernetes "$k8s_version" "kubernetes-$k8s_version" "$k8s_ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
  k8s.io/kubernetes/cmd/kubectl
want etcd && build etcd "$ETCD_VERSION" etcd "-X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" \
  go.etcd.io/etcd/server/v3
want containerd && build containerd "$CONTAINERD_VERSION" containerd \
  "-X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
want cni-plugins && build cni-plugins "$CNI_PLUGINS_VERSION" cni-plugins "" \
  github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap
want crictl && build crictl "$CRICTL_VERSION" crictl "-X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRICTL_VERSION" \
  sigs.k8s.io/cri-tools/cmd/crictl
# NVIDIA's CDI spec generator (`nvidia-ctk cdi generate`) and the hook its specs name, which the tests
# run against the mock NVML library (tests/nvidia_layouts.py). The only cgo build here: go-nvml
# dlopens libnvidia-ml.so.1 and its cgo stubs name NVML's symbols, which stay unresolved until that
# dlopen (hence the linker flags NVIDIA's own Makefile uses); gcc is needed, as for the mock itself.
# NVML's header marks some of the functions go-nvml wraps deprecated: those warnings are silenced.
# Without gcc (and nothing built yet), `all` leaves it out with a warning, since the cluster itself
# needs no cgo; asked for alone, it fails.
ctk="github.com/NVIDIA/nvidia-container-toolkit"
ctk_ldflags="-extldflags=-Wl,--export-dynamic,--unresolved-symbols=ignore-in-object-files,-z,lazy"
ctk_ldflags+=" -X $ctk/internal/info.version=$NVIDIA_CONTAINER_TOOLKIT_VERSION"
if want nvidia-container-toolkit; then
  if command -v gcc >/dev/null || [ -f "$cache/nvidia-container-toolkit/v$NVIDIA_CONTAINER_TOOLKIT_VERSION/.complete" ]; then
    CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
      build nvidia-container-toolkit "$NVIDIA_CONTAINER_TOOLKIT_VERSION" nvidia-container-toolkit "$ctk_ldflags" \
      "$ctk/cmd/nvidia-ctk" "$ctk/cmd/nvidia-cdi-hook"
  else
    echo "build.sh: nvidia-container-toolkit needs gcc (cgo) and none is on PATH: bash hack/install.d/gcc.sh" >&2
    [ "$only" = all ] || exit 1
  fi
fi
# The peer kubelet plugin the prepare benchmark compares with (`make bench-cluster` only, so it is not
# part of `all`: `make test` never waits for it).
[ "$only" = dra-example-driver ] && build dra-example-driver "$DRA_EXAMPLE_DRIVER_VERSION" dra-example-driver "" \
  sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin
exit 0
