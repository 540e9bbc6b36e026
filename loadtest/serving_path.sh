#!/usr/bin/env bash
# The serving path's own CPU cost per request, with the model's taken out: serve_config.yaml
# as shipped (fast path, CPU pool in a replica of its own) serving a fake model that costs
# nothing (`fake:384`), so every CPU-ms the server's processes spend per request (HAProxy,
# the ingress, the hop, the pool's queue and worker hand-off, Ray's own) is the path's.
# Interleaved rounds of the two pool hops: `auto` (the local hop) and `serve` (Serve's
# handle, as before it), the single profile (1 text, 32 in flight) and one user each;
# and in the same rounds the two floors under them, serving the same free model: the Serve
# floor (`loadtest.serve_floor`: the HTTP floor's raw ASGI app as one Serve ingress behind
# the same fast path: what any Serve app pays) and the HTTP floor (`loadtest.floor_server`:
# one uvicorn process: what any HTTP server pays here); and the hop floor
# (`loadtest.hop_floor`: Blitz's local hop between two plain processes, a do-nothing
# handler: what crossing to the pool's process costs before the pool does anything).
# Legs (LEGS, in this order each round): `auto`, `serve` and `servefloor` run under `serve run`;
# `serve-sh` and `servefloor-sh` are `auto` and `servefloor` under `bash scripts/serve.sh`
# (the shipped entry point: no driver, dashboard or log monitor); `floor`; `hopfloor`.
# One user's target (issue 46): the shipped config's p50 <= the Serve floor's + the hop
# floor's + 0.3 ms, per round (serve-sh against servefloor-sh when both ran, else auto
# against servefloor).
# Usage: bash loadtest/serving_path.sh [OUT_DIR]; ROUNDS (3), DUR/WARM (15/5), LEGS
# ("auto serve servefloor floor hopfloor").
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/serving-path-$(date +%Y%m%d-%H%M%S)}"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-15}"; WARM="${WARM:-5}"
LEGS="${LEGS:-auto serve servefloor floor hopfloor}"
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
"$PY" - serve_config.yaml "$OUT/config-servefloor.yaml" <<'EOF'
import sys, yaml
with open(sys.argv[1]) as f:
    config = yaml.safe_load(f)
config["applications"] = [{"name": "floor", "route_prefix": "/",
                           "import_path": "loadtest.serve_floor:build_app",
                           "args": {"model": "free", "source": "fake:384", "backend": "torch"}}]
with open(sys.argv[2], "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
EOF
stop_ray
for r in $(seq 1 "$ROUNDS"); do
  for hop in $LEGS; do
    echo "== round $r: $hop"
    if [ "$hop" = hopfloor ]; then
      "$PY" -m loadtest.hop_floor --per-round 300 --out "$OUT/r$r-$hop-oneuser.json" > /dev/null
      continue
    fi
    case "$hop" in
      floor) setsid "$PY" -m loadtest.floor_server --port 8000 --model free --source fake:384 \
        --backend torch > "$OUT/r$r-$hop.log" 2>&1 & ;;
      serve-sh|servefloor-sh) config="$OUT/config-auto.yaml"
        [ "$hop" = servefloor-sh ] && config="$OUT/config-servefloor.yaml"
        BLITZ_SERVE_CONFIG="$config" BLITZ_SKIP_INSTALL=1 \
        setsid bash scripts/serve.sh > "$OUT/r$r-$hop.log" 2>&1 & ;;
      *) setsid .venv/bin/serve run "$OUT/config-$hop.yaml" > "$OUT/r$r-$hop.log" 2>&1 & ;;
    esac
    SERVER=$!
    wait_for http://127.0.0.1:8000/health
    "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" --model free \
      --profile single --server-pids "$SERVER" --out "$OUT/r$r-$hop-single.json" > /dev/null
    "$PY" -m loadtest hops --model free --rounds 1 --per-round 300 \
      --out "$OUT/r$r-$hop-oneuser.json" > /dev/null
    stop_server
  done
done
"$PY" - "$OUT" "$ROUNDS" $LEGS <<'EOF' | tee "$OUT/report.md"
import json, os, statistics, sys
out, rounds, ran = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names = {"serve-sh": "Blitz, the local hop (shipped), `scripts/serve.sh`",
         "auto": "Blitz, the local hop (shipped), `serve run`",
         "serve": "Blitz, Serve's handle to the pool, `serve run`",
         "servefloor-sh": "the Serve floor (`loadtest.serve_floor`), `scripts/serve.sh`",
         "servefloor": "the Serve floor (`loadtest.serve_floor`), `serve run`",
         "floor": "the HTTP floor (`loadtest.floor_server`)",
         "hopfloor": "the hop floor (`loadtest.hop_floor`: the local hop, nothing behind it)"}
legs = {leg: name for leg, name in names.items() if leg in ran}
def get(r, leg):
    user = json.load(open(f"{out}/r{r}-{leg}-oneuser.json"))["summary"]["served"]["p50"]
    path = f"{out}/r{r}-{leg}-single.json"
    if not os.path.exists(path):
        return None, None, user, 0
    run = json.load(open(path))["results"][0]
    return run["server_cpu_ms_per_request"], run["requests_per_s"], user, run["errors"]
rows = {leg: [get(r, leg) for r in range(1, rounds + 1)] for leg in legs}
def med(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({values[0]:.2f}-{values[-1]:.2f})"
print("| what | server CPU-ms per request | requests/s | one user p50 ms | "
      "one user p50 - the HTTP floor's | errors |")
print("|---|---|---|---|---|---|")
for leg, name in legs.items():
    over = ([row[2] - floor[2] for row, floor in zip(rows[leg], rows["floor"])]
            if "floor" in rows else [])
    print(f"| {name} | {med(r[0] for r in rows[leg])} | {med(r[1] for r in rows[leg])} | "
          f"{med(r[2] for r in rows[leg])} | {med(over)} | {sum(r[3] for r in rows[leg])} |")
def ratio(a, b, i):
    if a not in rows or b not in rows:
        return "-"
    return med(x[i] / y[i] if x[i] is not None and y[i] else None
               for x, y in zip(rows[a], rows[b]))
print(f"\nper round, then the median (min-max): CPU-ms per request, local hop / Serve's handle "
      f"{ratio('auto', 'serve', 0)}; the Serve floor / Serve's handle {ratio('servefloor', 'serve', 0)}"
      f"; the Serve floor / the local hop {ratio('servefloor', 'auto', 0)}"
      f" (under serve.sh: {ratio('servefloor-sh', 'serve-sh', 0)}); one user p50, local "
      f"hop / Serve's handle {ratio('auto', 'serve', 2)}")
blitz, serve_floor = (("serve-sh", "servefloor-sh") if "serve-sh" in rows and "servefloor-sh" in rows
                      else ("auto", "servefloor"))
if blitz in rows and serve_floor in rows and "hopfloor" in rows:
    margins = [b[2] - s[2] - h[2] for b, s, h in zip(rows[blitz], rows[serve_floor], rows["hopfloor"])]
    per = ", ".join(f"{m:+.2f}" for m in margins)
    verdict = "met" if all(m <= 0.3 for m in margins) else "**not met**"
    print(f"\none user p50, {blitz} - ({serve_floor} + hopfloor), per round: {per} ms; "
          f"target <= +0.30 ms in every round: {verdict}")
EOF
