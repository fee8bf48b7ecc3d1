#!/usr/bin/env bash
# Install Debian's `prometheus` package when no prometheus binary is on PATH (idempotent).
# tests/e2e/test_prometheus.py runs a real Prometheus against a real `gmlx serve`; without the
# binary it skips. Needs root and apt-get; elsewhere it says what to do and exits 0.
# The package's own service is stopped and disabled: the tests start their own Prometheus on a
# free loopback port with a generated config.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_prometheus: not root or no apt-get; install Prometheus yourself (e.g. sudo apt-get install prometheus)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101 keeps the package's postinst from starting a system Prometheus on :9090.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
cleanup() { [ $made_policy = 1 ] && rm -f "$policy"; return 0; }
trap cleanup EXIT
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && echo "install_prometheus: $(prometheus --version 2>&1 | head -1)"
