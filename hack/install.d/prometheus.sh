#!/usr/bin/env bash
# Debian's prometheus package, for tests/cluster/test_gpu_monitoring.py (a real Prometheus scrapes the
# chart's components and evaluates its PrometheusRule) and tests/chart/test_monitoring.py
# (`promtool check rules` on the rendered rules). The .deb is downloaded and unpacked into
# .tools/prometheus/ rather than installed: installing would add a system service that starts a
# Prometheus on :9090 and a data directory under /var/lib, neither of which a test wants. The
# binaries are Go programs that need only libc; the web UI's assets (the package's dependencies)
# are not needed for the HTTP API the tests query.
# Idempotent and fast when .tools/bin/prometheus and promtool already run.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOOLS="${TOOLS_DIR:-$PWD/.tools}"
BIN="$TOOLS/bin"

if [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ] && "$BIN/prometheus" --version >/dev/null 2>&1; then
  exit 0
fi
command -v apt-get >/dev/null || { echo "prometheus.sh: apt-get is required (Debian's prometheus package)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1); then
  if [ "$(id -u)" != 0 ]; then
    echo "prometheus.sh: cannot download the prometheus package and not root to run apt-get update;" \
      "the monitoring tests skip" >&2
    exit 0
  fi
  apt-get update -qq
  (cd "$work" && apt-get download -qq prometheus >/dev/null)
fi
deb="$(ls "$work"/prometheus_*.deb)"
version="$(dpkg-deb -f "$deb" Version)"
dest="$TOOLS/prometheus/$version"
rm -rf "$dest"
mkdir -p "$dest" "$BIN"
dpkg-deb -x "$deb" "$work/root"
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$dest/"
ln -sfn "$dest/prometheus" "$BIN/prometheus"
ln -sfn "$dest/promtool" "$BIN/promtool"
echo "prometheus.sh: installed Debian's prometheus $version at $BIN/prometheus (and promtool)"
