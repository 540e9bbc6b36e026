#!/usr/bin/env bash
# Issue #33 item 1's recipe, as a user runs it: a 2-core Ray node with one GPU declared,
# `serve deploy serve_config.yaml`, then a redeploy with one model more under 8 clients
# (loadtest/redeploy.py). Usage: bash loadtest/redeploy.sh [OUT_FILE]
# (after `bash scripts/install.sh dev`; stops its Ray node at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/redeploy-$(date +%Y%m%d-%H%M%S).json}"
mkdir -p "$(dirname "$OUT")"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=token
trap 'BLITZ_DRAIN_S=10 bash scripts/stop.sh >/dev/null 2>&1 || true' EXIT  # HAProxy too: a bare ray stop leaves it
.venv/bin/ray start --head --num-cpus 2 --num-gpus 1 --disable-usage-stats >/dev/null
.venv/bin/serve deploy serve_config.yaml
for _ in $(seq 1 600); do
  curl -sf -X POST -H 'content-type: application/json' -d '{"texts":["ready?"]}' \
    http://127.0.0.1:8000/embed >/dev/null && break
  sleep 1
done
.venv/bin/python -m loadtest.redeploy | tee "$OUT"
