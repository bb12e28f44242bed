#!/usr/bin/env bash
# The chart's and hack's shell is linted with ShellCheck (tests/chart: the e2e script, the HAMi-core
# init container's script); without it those tests skip. Idempotent: nothing to do when installed.
set -euo pipefail
if command -v shellcheck >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq shellcheck >/dev/null
