#!/usr/bin/env bash
# Install (scripts/install.sh), then run the whole test suite: unit tests, then
# integration tests on one shared Ray + Serve instance.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
