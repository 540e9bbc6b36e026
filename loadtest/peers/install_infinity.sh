#!/usr/bin/env bash
# Install Infinity (michaelfeil/infinity, PyPI `infinity-emb`) into its own virtual
# environment, .venv-infinity at the repository root (git-ignored), for the peer rows of
# loadtest/benchmark.sh. Blitz's .venv is not touched.
#
# The CPU build of torch goes in FIRST and pinned: an unpinned `torch` (infinity-emb[torch]
# asks for torch>=2.2.1) would resolve to the default CUDA wheel and gigabytes of nvidia-*
# packages. With torch already satisfied, pip keeps it.
# Extras: server (the CLI and HTTP API), torch (the torch engine, sentence-transformers<4),
# optimum (the ONNX engine, optimum[onnxruntime]).
# Usage: bash loadtest/peers/install_infinity.sh   (INFINITY_VERSION, TORCH_VERSION, PYTHON)
set -euo pipefail
cd "$(dirname "$0")/../.."
INFINITY_VERSION="${INFINITY_VERSION:-0.0.78}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV=.venv-infinity
PYTHON="${PYTHON:-$(readlink -f .venv/bin/python 2>/dev/null || command -v python3)}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION"
"$VENV/bin/pip" install --quiet "infinity-emb[server,torch,optimum]==$INFINITY_VERSION" \
  "torch==$TORCH_VERSION"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("infinity-emb", "torch", "sentence-transformers", "transformers", "optimum",
             "onnxruntime", "numpy"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY
