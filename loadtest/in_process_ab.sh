#!/usr/bin/env bash
# `ingress.cpu_pool: replicas` (the CPU pool in replicas of its own) against `in_process`
# (its models inside the ingress replica), interleaved
# (docs/benchmarks-history.md, "One hop less"): one Ray started by scripts/serve.sh with two
# applications of
# serve_config.yaml, `/` (replicas) and `/local` (in_process), each claiming one CPU of
# this 2-core machine (a claim, not a limit: both run the same threads); then ROUNDS
# rounds of, for each in turn: one user (`loadtest hops`, 1 text, 1 in flight, beside the
# in-process int8 call), the single profile and the batch32 profile, all on
# `minilm-int8`. Ends with the median per-round ratio in_process / replicas.
#
#   bash loadtest/in_process_ab.sh OUT      # ROUNDS=3 DUR=20 ONE_USER_N=300
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: loadtest/in_process_ab.sh OUT}
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-20}; ONE_USER_N=${ONE_USER_N:-300}
PY=.venv/bin/python
mkdir -p "$OUT"
"$PY" - "$OUT/ab_config.yaml" <<'EOF'
import copy
import sys

import yaml

with open("serve_config.yaml") as f:
    config = yaml.safe_load(f)
app = config["applications"][0]
app["args"].setdefault("ingress", {})["cpu_pool"] = "replicas"
pool = app["args"]["cpu_pool"].setdefault("deployment", {})
pool.setdefault("ray_actor_options", {})["num_cpus"] = 1
local = copy.deepcopy(app)
local.update(name="local", route_prefix="/local")
local["args"].setdefault("ingress", {})["cpu_pool"] = "in_process"
config["applications"].append(local)
with open(sys.argv[1], "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
EOF

BLITZ_SKIP_INSTALL=1 BLITZ_SERVE_CONFIG="$OUT/ab_config.yaml" bash scripts/serve.sh \
  > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for path in /health /local/health; do
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:8000$path" >/dev/null && break; sleep 1; done
done
for prefix in "" /local; do  # the model resident (and its ONNX build made) before timing
  curl -sf --max-time 600 "http://127.0.0.1:8000$prefix/embed" -H 'content-type: application/json' \
    -d '{"texts": ["warm up"], "model": "minilm-int8"}' >/dev/null
done

for round in $(seq 1 "$ROUNDS"); do
  dir="$OUT/rounds/r$round"; mkdir -p "$dir"
  for mode in replicas in_process; do
    prefix=""; [ "$mode" = in_process ] && prefix=/local
    echo "== round $round/$ROUNDS, $mode: one user"
    "$PY" -m loadtest hops --url "http://127.0.0.1:8000$prefix" --model minilm-int8 \
      --inprocess onnx-int8 --rounds 2 --per-round "$ONE_USER_N" \
      --out "$dir/oneuser-$mode.json" > /dev/null
  done
  for profile in single batch32; do
    for mode in replicas in_process; do
      prefix=""; [ "$mode" = in_process ] && prefix=/local
      echo "== round $round/$ROUNDS, $mode: $profile"
      "$PY" -m loadtest run --url "http://127.0.0.1:8000$prefix" --model minilm-int8 \
        --profile "$profile" --duration "$DUR" --warmup 5 --no-progress \
        --out "$dir/$mode-$profile.json" > /dev/null
    done
  done
done

"$PY" - "$OUT" <<'EOF' | tee "$OUT/ab.md"
import json
import statistics
import sys
from pathlib import Path

rounds = sorted(Path(sys.argv[1], "rounds").glob("r*"))


def read(path: Path) -> dict:
    return json.loads(path.read_text())


rows = []
def add(label: str, values: dict[str, list[float]], ratio: bool = True) -> None:
    a, b = values["replicas"], values["in_process"]
    per = [y / x for x, y in zip(a, b)] if ratio else [y - x for x, y in zip(a, b)]
    rows.append((label, statistics.median(a), statistics.median(b),
                 statistics.median(per), min(per), max(per)))

one = {m: [read(r / f"oneuser-{m}.json")["summary"] for r in rounds]
       for m in ("replicas", "in_process")}
add("one user p50 ms", {m: [s["served"]["p50"] for s in one[m]] for m in one})
add("one user p99 ms", {m: [s["served"]["p99"] for s in one[m]] for m in one})
add("one user p50 - in-process call, ms",
    {m: [s["served_minus_inprocess_p50_ms"] for s in one[m]] for m in one}, ratio=False)
for profile in ("single", "batch32"):
    add(f"{profile} emb/s", {m: [read(r / f"{m}-{profile}.json")["results"][0]["embeddings_per_s"]
                                 for r in rounds] for m in ("replicas", "in_process")})
print(f"{len(rounds)} rounds; medians; per-round in_process vs replicas "
      "(ratio, or difference for the gap)\n")
print("| figure | replicas | in_process | in_process vs replicas (median) | spread |")
print("|---|---|---|---|---|")
for label, a, b, med, lo, hi in rows:
    unit = "ms" if "gap" in label or "-" in label else "x"
    fmt = (lambda v: f"{v:+.2f} ms") if unit == "ms" else (lambda v: f"{v:.2f}x")
    print(f"| {label} | {a:,.2f} | {b:,.2f} | {fmt(med)} | {fmt(lo)} to {fmt(hi)} |")
hops = {m: one[m][-1]["hops_p50_ms"] for m in one}
print("\nhops p50 ms, last round:", json.dumps(hops))
EOF
