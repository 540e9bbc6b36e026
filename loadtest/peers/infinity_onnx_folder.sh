#!/usr/bin/env bash
# Prepare a model folder for Infinity's ONNX engine (`--engine optimum`): a copy of SRC
# (symbolic links to its files) with an fp32 ONNX export as `model.onnx` at its root.
#
# Why: Infinity 0.0.78 looks for `*.onnx` files in a local model folder and fails to start
# without one ("No onnx files found"); sentence-transformers folders such as MiniLM's ship
# none. The export is optimum's own (`optimum-cli export onnx --task feature-extraction`,
# from .venv-infinity), i.e. what Infinity's optimum engine would load from the Hub.
# It sits at the root because Infinity passes the file to optimum as a path (see
# loadtest/peers/infinity_serve.sh for the one other workaround). Idempotent: an existing
# DST/model.onnx is kept.
# Usage: bash loadtest/peers/infinity_onnx_folder.sh SRC DST
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC="$(readlink -f "$1")"; DST="$2"
if [ -f "$DST/model.onnx" ]; then echo "$DST"; exit 0; fi
rm -rf "$DST" "$DST.export"
mkdir -p "$(dirname "$DST")"
cp -rs "$SRC" "$DST"
HF_HUB_OFFLINE=1 .venv-infinity/bin/optimum-cli export onnx --model "$SRC" \
  --task feature-extraction --library-name transformers "$DST.export" >"$DST.export.log" 2>&1 \
  || { cat "$DST.export.log" >&2; exit 1; }
mv "$DST.export/model.onnx" "$DST/model.onnx"
rm -rf "$DST.export" "$DST.export.log"
echo "$DST"
