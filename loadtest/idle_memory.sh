#!/usr/bin/env bash
# Idle memory of `bash scripts/serve.sh` (issue #24): start it, wait for /ready, embed once
# with minilm, wait IDLE_S (20), then PSS per process and in all (python -m loadtest.memory)
# over serve.sh's whole process tree (Ray, its workers, HAProxy; `serve run` on its old
# path: lifecycle.py adopts the driver-less Ray as a subreaper), and the Blitz
# metrics scraped through Prometheus's file-discovery list; stop it.
# Usage: bash loadtest/idle_memory.sh [OUT_FILE]   (extra serve.sh environment passes through)
# On a shared machine, hold the server lock: flock /tmp/blitz-server.lock bash loadtest/idle_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-/dev/stdout}"
IDLE_S="${IDLE_S:-20}"
BLITZ_SKIP_INSTALL="${BLITZ_SKIP_INSTALL:-1}" BLITZ_DRAIN_S=0 setsid bash scripts/serve.sh \
  > "${SERVE_LOG:-/dev/null}" 2>&1 &
pid=$!
stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 1 240); do
  curl -sf http://127.0.0.1:8000/ready >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { echo "serve.sh exited" >&2; exit 1; }
  sleep 1
done
curl -sf http://127.0.0.1:8000/embed -H 'content-type: application/json' \
  -d '{"texts": ["an idle server"], "model": "minilm"}' >/dev/null
sleep "$IDLE_S"
.venv/bin/python -m loadtest.memory "$pid" > "$OUT"
# the metrics export, found as Prometheus finds it (docs/operations.md, "Metrics and dashboards")
.venv/bin/python - >> "$OUT" <<'PY'
import json, urllib.request
targets = json.load(open("/tmp/ray/prom_metrics_service_discovery.json"))[0]["targets"]
text = "".join(urllib.request.urlopen(f"http://{t}/metrics", timeout=10).read().decode()
               for t in targets)
names = {line.split("{")[0] for line in text.splitlines() if line.startswith("ray_blitz_")}
print(f"\nmetrics: {len(targets)} discovery target(s) {targets}; ray_blitz_ series: {sorted(names)}")
PY
