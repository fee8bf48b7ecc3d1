#!/usr/bin/env bash
# Install the real agent clients (Claude Code, pi, opencode, Codex CLI) that tests/agents runs against
# gmlx: the versions pinned in tests/agents/package-lock.json, into tests/agents/node_modules
# (idempotent, npm registry only).
# Without Node.js and npm it says so and exits 0; the tests then skip, except under CI=true, where they fail.
set -euo pipefail
cd "$(dirname "$0")/../tests/agents"
if ! command -v npm >/dev/null 2>&1; then
  echo "install_agents: npm not found; install Node.js 20+ to run the agent-client tests" >&2
  exit 0
fi
if [ -x node_modules/.bin/claude ] && [ -x node_modules/.bin/pi ] && [ -x node_modules/.bin/opencode ] \
    && [ -x node_modules/.bin/codex ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
# npm ci wants every platform's optional package of a client in the lock; a registry mirror that lacks some
# (opencode's darwin/windows/musl builds) leaves them out, so fall back to an install that follows the lock
# for what it holds (the clients themselves are pinned exactly in package.json).
npm ci --no-audit --no-fund --loglevel=error 2>/dev/null || npm install --no-audit --no-fund --loglevel=error
echo "install_agents: $(node_modules/.bin/claude --version 2>&1), pi $(node_modules/.bin/pi --version 2>&1)," \
  "opencode $(node_modules/.bin/opencode --version 2>&1), $(node_modules/.bin/codex --version 2>&1)"
