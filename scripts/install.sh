#!/usr/bin/env bash
# Create .venv in the repository root and install Blitz with everything it needs.
# The pinned CPU torch goes first: a plain `torch` requirement would pull CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
# The JavaScript example client's one dependency (@msgpack/msgpack, pinned in
# examples/js/package-lock.json), which the portable-layout test runs under Node.
# Installed again only when the lock file changed; skipped with a note where npm is absent
# (serving needs no Node; the test then fails and says why).
if command -v npm >/dev/null; then
  if ! cmp -s examples/js/package-lock.json examples/js/node_modules/.blitz-installed-lock; then
    npm ci --prefix examples/js --no-audit --no-fund --loglevel=error
    cp examples/js/package-lock.json examples/js/node_modules/.blitz-installed-lock
  fi
else
  echo "install.sh: npm not found; the JavaScript example and its test need Node 18+" >&2
fi
