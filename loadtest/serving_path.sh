#!/usr/bin/env bash
# The serving path's own CPU cost per request, with the model's taken out: serve_config.yaml
# as shipped (fast path, CPU pool in a replica of its own) serving a fake model that costs
# nothing (`fake:384`), so every CPU-ms the server's processes spend per request (HAProxy,
# the ingress, the hop, the pool's queue and worker hand-off, Ray's own) is the path's.
# Interleaved rounds of the two pool hops: `auto` (the local hop) and `serve` (Serve's
# handle, as before it), the single profile (1 text, 32 in flight) and one user each.
# Usage: bash loadtest/serving_path.sh [OUT_DIR]; ROUNDS (3), DUR/WARM (15/5).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/serving-path-$(date +%Y%m%d-%H%M%S)}"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-15}"; WARM="${WARM:-5}"
PY=.venv/bin/python
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
wait_for() { for _ in $(seq 1 180); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
stop_ray() {
  pkill -f "serve run" || true; sleep 1; .venv/bin/ray stop --force >/dev/null 2>&1 || true
  pkill -x haproxy || true; sleep 1
}
SERVER=""
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill -INT -- "-$SERVER" 2>/dev/null || true
  for _ in $(seq 1 90); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""; stop_ray
}
trap 'stop_server; exit 130' INT TERM
trap 'stop_server' EXIT
for hop in auto serve; do
  "$PY" - serve_config.yaml "$OUT/config-$hop.yaml" "$hop" <<'EOF'
import sys, yaml
with open(sys.argv[1]) as f:
    config = yaml.safe_load(f)
for app in config["applications"]:
    args = app["args"]
    args["models"] = [{"id": "free", "source": "fake:384"}]
    args["cpu_pool"]["preload"] = ["free"]
    args.setdefault("ingress", {})["pool_hop"] = sys.argv[3]
with open(sys.argv[2], "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
EOF
done
stop_ray
for r in $(seq 1 "$ROUNDS"); do
  for hop in auto serve; do
    echo "== round $r: pool_hop $hop"
    setsid .venv/bin/serve run "$OUT/config-$hop.yaml" > "$OUT/r$r-$hop.log" 2>&1 &
    SERVER=$!
    wait_for http://127.0.0.1:8000/health
    "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" --model free \
      --profile single --server-pids "$SERVER" --out "$OUT/r$r-$hop-single.json" > /dev/null
    "$PY" -m loadtest hops --model free --rounds 1 --per-round 300 \
      --out "$OUT/r$r-$hop-oneuser.json" > /dev/null
    stop_server
  done
done
"$PY" - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/report.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def get(r, hop):
    run = json.load(open(f"{out}/r{r}-{hop}-single.json"))["results"][0]
    user = json.load(open(f"{out}/r{r}-{hop}-oneuser.json"))["summary"]["served"]["p50"]
    return run["server_cpu_ms_per_request"], run["requests_per_s"], user, run["errors"]
rows = [(get(r, "auto"), get(r, "serve")) for r in range(1, rounds + 1)]
print("| round | CPU-ms/request auto / serve | ratio | req/s auto / serve | one user p50 ms auto / serve | errors |")
print("|---|---|---|---|---|---|")
for r, (a, s) in enumerate(rows, 1):
    print(f"| {r} | {a[0]:.2f} / {s[0]:.2f} | {a[0] / s[0]:.2f}x | {a[1]:.0f} / {s[1]:.0f} | "
          f"{a[2]:.2f} / {s[2]:.2f} | {a[3]} / {s[3]} |")
print(f"\nmedian CPU-ms ratio (local hop / Serve's handle): "
      f"{statistics.median(a[0] / s[0] for a, s in rows):.2f}x; one user p50 ratio: "
      f"{statistics.median(a[2] / s[2] for a, s in rows):.2f}x")
EOF
