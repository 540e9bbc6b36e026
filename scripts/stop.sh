#!/usr/bin/env bash
# Stop a cluster started with `ray start` + `serve deploy` (README "Start and stop"):
# Serve's own shutdown, then `ray stop` (every Ray process of this user on this
# machine), then any HAProxy that outlived its Ray node. Extra arguments go to
# `ray stop` (e.g. --force). Not needed for scripts/serve.sh, which stops its own.
set -uo pipefail
cd "$(dirname "$0")/.."
RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}" .venv/bin/serve shutdown -y \
  || echo "stop.sh: serve shutdown failed (no Serve running?); stopping Ray anyway" >&2
.venv/bin/ray stop "$@"
.venv/bin/python scripts/lifecycle.py reap
