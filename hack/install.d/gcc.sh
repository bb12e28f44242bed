#!/usr/bin/env bash
# gcc builds hack/mock-nvml (the mock libnvidia-ml.so.1 that tests/devices loads through pynvml).
set -euo pipefail
if command -v gcc >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq gcc libc6-dev >/dev/null
