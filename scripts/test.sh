#!/usr/bin/env bash
# Install (scripts/install.sh), lint (ruff) and type-check blitz/ and deployments/ (mypy),
# both configured in pyproject.toml, then run the whole test suite: unit tests, then
# integration, fault and cluster tests on one shared Ray + Serve instance. Any step that
# fails fails the command. Arguments go to pytest: `bash scripts/test.sh -m "not slow"` is
# the inner loop (unit tests and other quick ones; README, "Set up").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
