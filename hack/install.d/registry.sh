#!/usr/bin/env bash
# Debian's docker-registry (the CNCF distribution registry, v2.8) for the release test
# (tests/cluster/test_registry_install.py): `make release` pushes the image and the chart to a real
# OCI registry on this machine, and the real cluster installs and pulls from it. The package's
# service is not used: the test runs `docker-registry serve` with its own TLS config. Idempotent.
set -euo pipefail
if command -v docker-registry >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "registry.sh: not root; install docker-registry yourself (apt-get install docker-registry)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d keeps the package's own service from starting (the test starts its registry itself).
policy=/usr/sbin/policy-rc.d
created=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 0755 "$policy" && created=1
fi
apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
if [ "$created" = 1 ]; then rm -f "$policy"; fi
