#!/usr/bin/env bash
# Stop a cluster started with `ray start` + `serve deploy` (docs/fast-path.md "Start and stop"):
# a drain (`lifecycle.py drain`: new requests 503 + Retry-After until those in flight are
# done), Serve's own shutdown, then `ray stop`
# (every Ray process of this user on this machine), then any HAProxy that outlived its
# Ray node. Extra arguments go to `ray stop` (e.g. --force). Not needed for
# scripts/serve.sh, which stops (and drains) its own.
set -uo pipefail
cd "$(dirname "$0")/.."
# Serve's shutdown kills HAProxy (and the proxies) at once, cutting requests in flight:
# drain first, which lets every replica finish what it holds.
drain_s="${BLITZ_DRAIN_S:-60}"
RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}" timeout "$(( ${drain_s%.*} + 60 ))" \
  .venv/bin/python scripts/lifecycle.py drain \
  || echo "stop.sh: drain failed or cut short; shutting down anyway" >&2
RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}" .venv/bin/serve shutdown -y \
  || echo "stop.sh: serve shutdown failed (no Serve running?); stopping Ray anyway" >&2
.venv/bin/ray stop "$@"
.venv/bin/python scripts/lifecycle.py reap
