#!/usr/bin/env bash
# Blitz through each entry point that runs on one machine, in interleaved rounds:
#   card          `serve run serve_config.yaml` from the venv, nothing exported (the card's
#                 command; serve_config.yaml's controller_options turn on the fast path)
#   serve-hop     the card with `ingress.pool_hop: serve`: the CPU pool called over Serve's
#                 handle, as before the local hop
#   default-proxy the card with its controller_options taken out: Serve's default Python
#                 proxy, what `serve run` of a config without them gets (the app warns)
#   serve-sh      `bash scripts/serve.sh` (lifecycle.py, no driver, the fast path)
#   serve-sh-again the same again: an A/A control, what this machine's noise alone makes of
#                 a ratio to serve-sh
# Each round starts each entry point in turn, warms `minilm-int8`, runs the single and
# batch32 profiles (DUR seconds each, the server's CPU time per request measured over all
# its processes, HAProxy included) and one user (1 text, 1 in flight: `loadtest hops`
# beside the in-process int8 call), then stops it; PSS over all its processes (HAProxy
# included, `python -m loadtest.memory`) IDLE_S after the warm-up (idle) and at its
# largest sample during the two profiles (peak), and each process's CPU time around each
# profile (the report splits the CPU-ms per request between them); then one user against the HTTP floor
# (`loadtest.floor_server`, nothing else running). `python -m loadtest entry-points OUT`
# reports the per-round ratios to serve-sh, their median and spread.
# Usage: bash loadtest/entry_points.sh [OUT_DIR]   (after `bash scripts/install.sh dev`)
# Environment: ROUNDS (3), DUR/WARM (15/5), IDLE_S (10), ONE_USER_N (300), LEGS ("card serve-hop
# default-proxy serve-sh"). Stops any Ray/Serve/HAProxy of this machine first (STOP_RAY=0: don't).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/entry-points-$(date +%Y%m%d-%H%M%S)}"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-15}"; WARM="${WARM:-5}"; ONE_USER_N="${ONE_USER_N:-300}"
IDLE_S="${IDLE_S:-10}"
LEGS="${LEGS:-card serve-hop default-proxy serve-sh}"
PY=.venv/bin/python
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
wait_for() { for _ in $(seq 1 "${2:-180}"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
stop_ray() {
  [ "${STOP_RAY:-1}" = 1 ] || return 0
  pkill -f "serve run" || true; sleep 1; .venv/bin/ray stop --force >/dev/null 2>&1 || true
  pkill -x haproxy || true; sleep 1
}
SERVER=""
stop_server() {  # SIGINT to the process group (Ctrl-C in a terminal), then SIGKILL after 90 s
  [ -n "$SERVER" ] || return 0
  kill -INT -- "-$SERVER" 2>/dev/null || true
  for _ in $(seq 1 90); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
  stop_ray
}
trap 'stop_server; exit 130' INT TERM
trap 'stop_server' EXIT

"$PY" - serve_config.yaml "$OUT/default-proxy-config.yaml" <<'EOF'
import sys
sys.path.insert(0, "scripts")
import os, shutil, tempfile
from lifecycle import default_proxy_config
import yaml
with tempfile.TemporaryDirectory() as d:
    shutil.copy(default_proxy_config(sys.argv[1], d), sys.argv[2])
with open(sys.argv[1]) as f:
    config = yaml.safe_load(f)
for app in config["applications"]:
    app["args"].setdefault("ingress", {})["pool_hop"] = "serve"
with open(sys.argv[2].replace("default-proxy", "serve-hop"), "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
EOF

start() {  # start LEG LOG: the leg's server in a process group of its own
  case "$1" in
    card) setsid .venv/bin/serve run serve_config.yaml > "$2" 2>&1 & ;;
    default-proxy) setsid .venv/bin/serve run "$OUT/default-proxy-config.yaml" > "$2" 2>&1 & ;;
    serve-hop) setsid .venv/bin/serve run "$OUT/serve-hop-config.yaml" > "$2" 2>&1 & ;;
    serve-sh|serve-sh-again) BLITZ_SKIP_INSTALL=1 setsid bash scripts/serve.sh > "$2" 2>&1 & ;;
  esac
  SERVER=$!
  wait_for http://127.0.0.1:8000/health
  curl -sf --max-time 600 http://127.0.0.1:8000/embed -H 'content-type: application/json' \
    -d '{"texts": ["warm up"], "model": "minilm-int8"}' >/dev/null
}

stop_ray
for r in $(seq 1 "$ROUNDS"); do
  dir="$OUT/r$r"; mkdir -p "$dir"
  for leg in $LEGS; do
    echo "== round $r: $leg"
    start "$leg" "$dir/$leg.log"
    sleep "$IDLE_S"
    "$PY" -m loadtest.memory "$SERVER" --with-haproxy --json > "$dir/$leg-pss-idle.jsonl"
    "$PY" -m loadtest.memory "$SERVER" --with-haproxy --json --peak 2 \
      > "$dir/$leg-pss-peak.jsonl" &
    sampler=$!
    for profile in single batch32; do
      "$PY" -m loadtest.memory "$SERVER" --with-haproxy --json > "$dir/$leg-$profile-procs0.jsonl"
      "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" --model minilm-int8 \
        --profile "$profile" --server-pids "$SERVER" --out "$dir/$leg-$profile.json" > /dev/null
      "$PY" -m loadtest.memory "$SERVER" --with-haproxy --json > "$dir/$leg-$profile-procs1.jsonl"
    done
    kill -TERM "$sampler"; wait "$sampler" || true
    "$PY" -m loadtest hops --model minilm-int8 --inprocess onnx-int8 --rounds 2 \
      --per-round "$ONE_USER_N" --out "$dir/oneuser-$leg.json" > /dev/null
    stop_server
  done
  echo "== round $r: the HTTP floor"
  "$PY" -m loadtest.floor_server --port 8002 > "$dir/floor.log" 2>&1 &
  floor=$!
  wait_for http://127.0.0.1:8002/health 120
  "$PY" -m loadtest hops --url http://127.0.0.1:8002 --model minilm-int8 --inprocess onnx-int8 \
    --rounds 2 --per-round "$ONE_USER_N" --out "$dir/oneuser-floor.json" > /dev/null
  kill "$floor"; wait "$floor" 2>/dev/null || true
done
"$PY" -m loadtest entry-points "$OUT" | tee "$OUT/report.md"
