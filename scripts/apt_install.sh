#!/usr/bin/env bash
# Install a Debian package when its binary is not on PATH (idempotent), without starting its service.
#   bash scripts/apt_install.sh PACKAGE BINARY VERSION_FLAG
# The tests start their own instance on a free loopback port with a generated config; without the
# binary they skip. Needs root and apt-get; elsewhere it says what to do and exits 0.
set -euo pipefail
package=$1 binary=$2 version_flag=$3
if command -v "$binary" >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_$package: not root or no apt-get; install it yourself (e.g. sudo apt-get install $package)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101 keeps the package's postinst from starting the system service with its default config.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
cleanup() { [ $made_policy = 1 ] && rm -f "$policy"; return 0; }
trap cleanup EXIT
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "$package" >/dev/null
command -v "$binary" >/dev/null && echo "install_$package: $("$binary" "$version_flag" 2>&1 | head -1)"
