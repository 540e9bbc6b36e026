#!/usr/bin/env bash
# Install (scripts/install.sh), then serve serve_config.yaml on http://127.0.0.1:8000.
#
# The fast request path is on by default (SPEC §10): Serve's throughput-optimized mode
# with HAProxy in front (about 3.7 CPU-ms per ingress->pool request instead of ~20 with
# the default Python proxy). These variables must be set before Ray starts, so they are
# exported here; `serve deploy` to a running cluster needs them on `ray start` too (see
# README). Set BLITZ_FAST_PATH=0 for Serve's default proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM=false
source scripts/fast-path.env.sh
exec .venv/bin/serve run serve_config.yaml "$@"
