#!/usr/bin/env bash
# Install Debian's `prometheus` package when no prometheus binary is on PATH (idempotent).
# tests/e2e/test_prometheus.py runs a real Prometheus against real `gmlx serve` hosts; without the
# binary it skips. The package's own service is not started (scripts/apt_install.sh): the tests start
# their own Prometheus on a free loopback port with a generated config.
exec bash "$(dirname "$0")/apt_install.sh" prometheus prometheus --version
