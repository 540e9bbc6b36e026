#!/usr/bin/env bash
# Install (scripts/install.sh), then serve serve_config.yaml on http://127.0.0.1:8000.
#
# The fast request path is on by default (docs/ray-notes.md, "Request path cost"): Serve's throughput-optimized mode
# with HAProxy in front (about 3.7 CPU-ms per ingress->pool request instead of ~20 with
# the default Python proxy). These variables must be set before Ray starts, so they are
# exported here; `serve deploy` to a running cluster needs them on `ray start` too (see
# docs/fast-path.md). Set BLITZ_FAST_PATH=0 for Serve's default proxy.
#
# Start and stop (scripts/lifecycle.py, docs/fast-path.md "Start and stop"): a stale HAProxy or Ray
# left by an earlier run is stopped first, and a port held by anything else is refused
# with a message. Then Ray's head starts with no long-lived driver (scripts/ray_up.py
# deploys the config and exits; a deploy that fails ends this script with status 1).
# Ctrl-C, SIGINT, SIGTERM or SIGHUP to this script stops every process it started (Ray,
# HAProxy): a drain first (new requests get 503 + Retry-After while those in flight
# finish; at most BLITZ_DRAIN_S, 60), then Serve's own shutdown, then SIGTERM/SIGKILL to
# Ray's processes.
# BLITZ_SERVE_CONFIG picks another config file; BLITZ_SKIP_INSTALL=1 skips install.sh.
#
# Ray starts without its dashboard, log monitor and autoscaler monitor (docs/fast-path.md,
# "What scripts/serve.sh leaves out"): the metrics export stays, the `serve status/deploy` CLI
# and the replicas' logs on this console go (they stay in /tmp/ray/session_*/logs).
# Arguments to this script go to `serve run`, which then stays as the driver (the old
# path, scripts/serve_run.py), as with BLITZ_DASHBOARD=1 (the dashboard kept) or
# BLITZ_CONSOLE_LOGS=1 (the replicas' logs on this console; ~230 MiB more at idle).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${BLITZ_SKIP_INSTALL:-0}" != "1" ] || [ ! -x .venv/bin/serve ]; then
  bash scripts/install.sh
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM=false
source scripts/fast-path.env.sh
# With HAProxy, Serve holds a stopping ingress replica open for at least this long so
# that load balancers can drop it (Ray's default 30 s makes Serve's own shutdown take
# ~35 s). HAProxy here is local and reloads in about a second.
if [ "${BLITZ_FAST_PATH:-1}" = "1" ]; then
  export RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S="${RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S:-5}"
fi
exec .venv/bin/python scripts/lifecycle.py run "${BLITZ_SERVE_CONFIG:-serve_config.yaml}" "$@"
