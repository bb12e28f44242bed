#!/usr/bin/env bash
# The sandbox API server (dev/hami_dra_dev/sandbox/certs.py) makes its self-signed TLS certificates with
# the openssl command line tool. Idempotent: does nothing when openssl is already installed.
set -euo pipefail
if command -v openssl >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq openssl >/dev/null
