#!/usr/bin/env bash
# Install (scripts/install.sh), lint (ruff) and type-check blitz/ and deployments/ (mypy),
# both configured in pyproject.toml, then run the whole test suite: the unit tests spread
# over the cores (pytest-xdist; no unit test starts Ray), then the integration, fault and
# cluster tests in one process on one shared Ray + Serve instance. Any step that fails
# fails the command. Arguments go to one pytest run instead: `bash scripts/test.sh -m "not
# slow" -n auto` is the inner loop (the quick unit tests; README, "Test").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest tests/unit -n auto
exec .venv/bin/python -m pytest tests/integration tests/faults tests/cluster
