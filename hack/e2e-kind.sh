#!/usr/bin/env bash
# End-to-end check of hami-dra on a real Kubernetes cluster, for people with Docker and kind.
#
# Creates a kind cluster (Kubernetes 1.34+, DRA on, DRAConsumableCapacity on, CDI in containerd),
# builds and loads the image, installs charts/hami-dra with simulated GPUs (one worker, four Tesla
# T4s), then replays the seed's lab with the recipes from api/examples and checks every placement:
#   binpack, binpack          -> gpu-0, gpu-0   (two 1000 MiB tenants: score 3.302083)
#   spread                    -> gpu-1          (one tenant: 1.651042)
#   mutex,binpack             -> gpu-2          (the worked example: mutex drops 0 and 1, index breaks the tie)
#   mutex                     -> gpu-3
#   binpack,numa              -> gpu-0          (the busiest card)
#   mutex,binpack,numa        -> Pending, ExclusiveDeviceAllocateConflict; gpu-1 once `spread` is deleted
# plus: pods run with HAMi-core's memory limit injected through CDI, and the ResourceSlice admission
# policy denies slice writes from the plugin's service account without a node.
#
# Usage: hack/e2e-kind.sh            (deletes the cluster at the end; KEEP=1 keeps it)
# Env:   CLUSTER_NAME (hami-dra-e2e), KIND_NODE_IMAGE (kindest/node:v1.34.0), IMAGE (hami-dra:e2e),
#        WAIT_SECONDS (180), KEEP (0)
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER_NAME:-hami-dra-e2e}"
NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.34.0}"
IMAGE="${IMAGE:-hami-dra:e2e}"
WAIT="${WAIT_SECONDS:-180}"
NS=hami-system
RELEASE=hami-dra
WORKER="${CLUSTER}-worker"
CONTEXT="kind-${CLUSTER}"

log() { printf '\n==> %s\n' "$*"; }
k() { kubectl --context "$CONTEXT" "$@"; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: '$tool' is required" >&2; exit 1; }
done
HELM="$(command -v helm || true)"
if [ -z "$HELM" ]; then
  bash hack/install.d/helm.sh
  HELM="$PWD/.tools/bin/helm"
fi

diagnostics() {
  echo "---- diagnostics ----" >&2
  k get pods -A -o wide >&2 || true
  k get resourceclaims -A -o wide >&2 || true
  for component in kubelet-plugin controller webhook; do
    k -n "$NS" logs -l "app.kubernetes.io/component=${component}" --tail=60 --prefix >&2 || true
  done
}
fail() {
  echo "e2e-kind: FAIL: $*" >&2
  diagnostics
  exit 1
}
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# wait_until DESCRIPTION COMMAND...: retry COMMAND every 2 s until it succeeds or WAIT runs out.
wait_until() {
  local what="$1" deadline=$((SECONDS + WAIT))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${WAIT}s waiting for: $what"
    sleep 2
  done
}

log "kind cluster ${CLUSTER} (${NODE_IMAGE})"
if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --wait 180s --config - <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
featureGates:
  DRAConsumableCapacity: true
containerdConfigPatches:
  - |-
    [plugins."io.containerd.grpc.v1.cri"]
      enable_cdi = true
nodes:
  - role: control-plane
  - role: worker
EOF
fi

log "image ${IMAGE}"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "helm install (simulated: 4 x T4 on ${WORKER})"
values="$(mktemp)"
trap 'rm -f "$values"; cleanup' EXIT
cat >"$values" <<EOF
image: {repository: "${IMAGE%:*}", tag: "${IMAGE##*:}", pullPolicy: Never}
logVerbosity: 2
kubeletPlugin:
  source: simulated
  simulated: {profile: t4, gpus: 4}
  nodeSelector: {kubernetes.io/hostname: "${WORKER}"}
EOF
"$HELM" --kube-context "$CONTEXT" upgrade --install "$RELEASE" charts/hami-dra \
  --namespace "$NS" --create-namespace -f "$values" --wait --timeout 5m

slice_devices() {
  k get resourceslices -o jsonpath="{range .items[?(@.spec.driver=='gpu.hami.io')]}{.spec.devices[*].name}{end}"
}
four_devices() { [ "$(slice_devices | wc -w)" -eq 4 ]; }
wait_until "a ResourceSlice with 4 GPUs" four_devices
k get resourceslices -o wide

# device_of POD: the device allocated to the pod's (only) claim, empty while unallocated.
device_of() {
  local claim
  claim="$(k get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')"
  [ -n "$claim" ] || return 0
  k get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}'
}
allocated() { [ -n "$(device_of "$1")" ]; }

# place RECIPE WANT [POD]: apply api/examples/RECIPE.yaml (its pod renamed to POD) and check that
# the pod's claim got device WANT.
place() {
  local file="api/examples/$1.yaml" pod="${3:-$1}" want="$2" got
  sed "s/^  name: $1\$/  name: ${pod}/" "$file" | k apply -f - >/dev/null
  wait_until "an allocation for pod ${pod}" allocated "$pod"
  got="$(device_of "$pod")"
  [ "$got" = "$want" ] || fail "pod ${pod} ($1): expected ${want}, got ${got}"
  echo "ok: ${pod} ($1) -> ${got}"
}

log "recipes"
place binpack gpu-0
place binpack gpu-0 binpack-2
place spread gpu-1
place mutex-binpack gpu-2
place mutex gpu-3
place binpack-numa gpu-0

log "mutex,binpack,numa with every card busy stays Pending"
k apply -f api/examples/mutex-binpack-numa.yaml >/dev/null
reports_conflict() { grep -q ExclusiveDeviceAllocateConflict <<<"$(k describe pod mutex-binpack-numa)"; }
wait_until "ExclusiveDeviceAllocateConflict on pod mutex-binpack-numa" reports_conflict
[ -z "$(device_of mutex-binpack-numa)" ] || fail "mutex-binpack-numa was allocated although every card has tenants"
echo "ok: Pending with ExclusiveDeviceAllocateConflict"

log "freeing gpu-1"
k delete pod spread --wait=true >/dev/null
wait_until "an allocation for mutex-binpack-numa" allocated mutex-binpack-numa
[ "$(device_of mutex-binpack-numa)" = gpu-1 ] || fail "mutex-binpack-numa: expected gpu-1, got $(device_of mutex-binpack-numa)"
echo "ok: mutex-binpack-numa -> gpu-1"

log "containers run with HAMi-core limits from CDI"
for pod in binpack binpack-2 mutex-binpack mutex binpack-numa mutex-binpack-numa; do
  k wait --for=condition=Ready "pod/${pod}" --timeout="${WAIT}s" >/dev/null || fail "pod ${pod} is not Ready"
  grep -qx 'CUDA_DEVICE_MEMORY_LIMIT_0=1000m' <<<"$(k logs "$pod")" || fail "pod ${pod} lacks CUDA_DEVICE_MEMORY_LIMIT_0=1000m"
done
echo "ok: 6 pods Ready with CUDA_DEVICE_MEMORY_LIMIT_0=1000m"

log "ResourceSlice admission policy"
plugin_sa="system:serviceaccount:${NS}:${RELEASE}-kubelet-plugin"
if out="$(k create --as="$plugin_sa" --as-group=system:serviceaccounts -f - 2>&1 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: e2e-forged-slice}
spec:
  driver: gpu.hami.io
  nodeName: ${CLUSTER}-control-plane
  pool: {name: forged, generation: 1, resourceSliceCount: 1}
EOF
)"; then
  fail "the plugin's service account created a slice without a node: ${out}"
fi
grep -q "ServiceAccountTokenPodNodeInfo" <<<"$out" || fail "slice write denied for another reason: ${out}"
echo "ok: denied (${out##*: })"

log "PASS"
