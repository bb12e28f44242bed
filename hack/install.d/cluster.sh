#!/usr/bin/env bash
# What the local real cluster (`hami-dra cluster up`, tests/cluster/) needs from Debian beyond
# podman.sh (runc, busybox-static), gcc.sh (static pause image) and openssl.sh (its PKI):
# iproute2 for the node address and the CNI bridge. Go itself comes with our machines; without it
# hack/cluster/build.sh stops with a clear message. Fast when installed.
set -euo pipefail
if command -v ip >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "cluster.sh: not root; install iproute2 yourself (the real-cluster tests skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq iproute2 >/dev/null
