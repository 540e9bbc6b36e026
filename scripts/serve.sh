#!/usr/bin/env bash
# Install (scripts/install.sh), then serve serve_config.yaml on http://127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM=false
exec .venv/bin/serve run serve_config.yaml "$@"
