#!/usr/bin/env bash
# Serve one local model folder with Infinity (.venv-infinity, loadtest/peers/install_infinity.sh),
# offline, on 127.0.0.1:PORT; OpenAI-compatible route POST /embeddings (no /v1 prefix).
# Usage: bash loadtest/peers/infinity_serve.sh ENGINE MODEL_DIR SERVED_NAME PORT
#   ENGINE torch: MODEL_DIR is the sentence-transformers folder as is.
#   ENGINE optimum: MODEL_DIR from loadtest/peers/infinity_onnx_folder.sh (model.onnx at root).
#
# Settings, all Infinity's own: CPU, batch size 32 (its default), no warm-up requests,
# mean pooling (what the model's 1_Pooling says; Infinity's optimum engine would otherwise
# take CLS pooling), telemetry off. Workarounds for the optimum engine, and why:
# - Started from inside MODEL_DIR with `--model-id .`: Infinity lists a local folder's
#   ONNX files as paths under MODEL_DIR and hands that path to optimum as the file name;
#   optimum-onnx 0.1.0 (what pip resolves for infinity-emb[optimum] today) then refuses
#   an absolute name ("Could not find any ONNX files with target file name /x/model.onnx,
#   only found: [model.onnx]"). From inside the folder the name is `model.onnx`.
# - `--onnx-disable-optimize`: Infinity's optimizer step fails with this optimum
#   ("OptimizationConfig.__init__() got an unexpected keyword argument
#   'optimize_with_onnxruntime_only'"), after which Infinity serves the unoptimized model
#   anyway; the flag skips the failing attempt. onnxruntime still applies its own default
#   graph optimizations when it opens the session.
set -euo pipefail
ENGINE="$1"; MODEL_DIR="$(readlink -f "$2")"; NAME="$3"; PORT="$4"
VENV="$(cd "$(dirname "$0")/../.." && pwd)/.venv-infinity"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 INFINITY_ANONYMOUS_USAGE_STATS=0
export TOKENIZERS_PARALLELISM=false
ARGS=(--engine "$ENGINE" --device cpu --served-model-name "$NAME" --host 127.0.0.1
      --port "$PORT" --batch-size 32 --no-model-warmup --pooling-method mean --log-level warning)
if [ "$ENGINE" = optimum ]; then
  cd "$MODEL_DIR"
  exec "$VENV/bin/infinity_emb" v2 --model-id . --onnx-disable-optimize "${ARGS[@]}"
fi
exec "$VENV/bin/infinity_emb" v2 --model-id "$MODEL_DIR" "${ARGS[@]}"
