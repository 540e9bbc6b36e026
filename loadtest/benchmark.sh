#!/usr/bin/env bash
# Every figure in BENCHMARKS.md, measured in one run on this machine (~12 minutes).
# Usage: bash loadtest/benchmark.sh [OUT_DIR]   (after `bash scripts/install.sh`)
# Stops any Ray/Serve running here first: the server is started with scripts/serve.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/bench-$(date +%Y%m%d-%H%M%S)}"
DUR="${DUR:-20}"; WARM="${WARM:-5}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=.venv/bin/python
run() { "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" "$@"; }
wait_for() { for _ in $(seq 1 120); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
stop_ray() { pkill -f "serve run" || true; sleep 1; .venv/bin/ray stop --force >/dev/null 2>&1 || true; pkill -x haproxy || true; sleep 1; }

stop_ray
echo "== machine"; { nproc; lscpu | grep -E "Model name|Flags" | cut -c1-200; } | tee "$OUT/machine.txt"

echo "== in-process ceilings and backends (no server running)"
"$PY" -m loadtest inprocess --backend torch --sizes 1,32,128 --seconds 10 --out "$OUT/inprocess-torch.json"
"$PY" -m loadtest inprocess --backend onnx-int8 --sizes 1,32,128 --seconds 10 --no-compare --out "$OUT/inprocess-int8.json"
"$PY" -m loadtest.backends --json "$OUT/backends.json"
"$PY" -m loadtest formats --out "$OUT/formats.json"

echo "== naive serving: FastAPI + sentence-transformers, 2 gunicorn workers"
.venv/bin/gunicorn -w 2 -k uvicorn.workers.UvicornWorker -b 127.0.0.1:8001 \
  loadtest.naive_server:app > "$OUT/naive.log" 2>&1 &
NAIVE=$!
wait_for http://127.0.0.1:8001/health || wait_for http://127.0.0.1:8001/docs
run --url http://127.0.0.1:8001 --api native-json --profile single --out "$OUT/naive-single.json"
run --url http://127.0.0.1:8001 --api native-json --profile batch32 --out "$OUT/naive-batch32.json"
kill "$NAIVE"; wait "$NAIVE" 2>/dev/null || true

echo "== Blitz (scripts/serve.sh: fast path, serve_config.yaml)"
bash scripts/serve.sh > "$OUT/serve.log" 2>&1 &
wait_for http://127.0.0.1:8000/health
for model in minilm minilm-int8; do  # load (and build) each model before measuring
  curl -sf http://127.0.0.1:8000/embed -H 'content-type: application/json' \
    -d "{\"texts\": [\"warm up\"], \"model\": \"$model\"}" >/dev/null
done
for model in minilm minilm-int8; do
  run --model "$model" --profile single --out "$OUT/blitz-$model-single.json"
  run --model "$model" --profile batch32 --out "$OUT/blitz-$model-batch32.json"
done
run --model minilm-int8 --profile single --api openai-base64 --out "$OUT/blitz-int8-openai-single.json"
"$PY" -m loadtest sweep --no-progress --duration 10 --warmup 3 --model minilm-int8 \
  --concurrency 1,4,16,32,64 --out "$OUT/blitz-int8-sweep.json" --plot "$OUT/blitz-int8-sweep.png"
stop_ray
echo "results in $OUT"
