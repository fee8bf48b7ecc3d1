#!/usr/bin/env bash
# Install Debian's `haproxy` package when no haproxy binary is on PATH (idempotent).
# tests/fleet runs a real HAProxy (deploy/haproxy) in front of several real `gmlx serve` hosts; without
# the binary those tests skip. Needs root and apt-get; elsewhere it says what to do and exits 0.
# The package's own service is stopped and disabled: the tests start their own HAProxy on free loopback
# ports with a generated config, and stop it at the end.
set -euo pipefail
if command -v haproxy >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_haproxy: not root or no apt-get; install HAProxy yourself (e.g. sudo apt-get install haproxy)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101 keeps the package's postinst from starting a system HAProxy on :80 with its default config.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
cleanup() { [ $made_policy = 1 ] && rm -f "$policy"; return 0; }
trap cleanup EXIT
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends haproxy >/dev/null
command -v haproxy >/dev/null && echo "install_haproxy: $(haproxy -v 2>&1 | head -1)"
