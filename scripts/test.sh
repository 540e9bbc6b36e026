#!/usr/bin/env bash
# Install (scripts/install.sh), type-check blitz/ (mypy, configured in pyproject.toml), then
# run the whole test suite: unit tests, then integration and fault tests on one shared
# Ray + Serve instance. Any step that fails fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
