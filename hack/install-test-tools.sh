#!/usr/bin/env bash
# Installs the non-Python tools the test suite uses (podman, helm, Prometheus, mock NVML build deps, ...).
# Each tool has its own idempotent script in hack/install.d/; `make test` runs them all, so a fresh
# clone (and CI) needs nothing installed by hand. Scripts must be quick when the tool is present.
set -euo pipefail
cd "$(dirname "$0")/.."
for script in hack/install.d/*.sh; do
  [ -e "$script" ] || continue
  echo "==> $script"
  bash "$script"
done
