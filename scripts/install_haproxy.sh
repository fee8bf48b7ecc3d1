#!/usr/bin/env bash
# Install Debian's `haproxy` package when no haproxy binary is on PATH (idempotent).
# tests/fleet runs a real HAProxy (deploy/haproxy) in front of several real `gmlx serve` hosts; without
# the binary those tests skip. The package's own service is not started (scripts/apt_install.sh).
exec bash "$(dirname "$0")/apt_install.sh" haproxy haproxy -v
