#!/usr/bin/env bash
# Install Debian's `chromium` when no chromium binary is on PATH (idempotent).
# tests/e2e/test_browser_origin.py drives pages in headless chromium against a real `gmlx serve`.
exec bash "$(dirname "$0")/apt_install.sh" chromium chromium --version
