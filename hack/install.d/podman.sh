#!/usr/bin/env bash
# podman + runc + busybox-static for tests/kubeletplugin/test_podman.py, which runs a container from a
# local busybox rootfs with `--device k8s.gpu.hami.io/gpu=...` against a CDI spec the plugin wrote.
# crun does not work on these machines (rlimits, hybrid cgroups), hence runc. Fast when installed.
set -euo pipefail
if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && [ -x /bin/busybox ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "podman.sh: not root; install podman, runc and busybox-static yourself (the podman test skips)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq podman runc busybox-static >/dev/null
