#!/usr/bin/env bash
# Create .venv in the repository root and install Blitz.
#   bash scripts/install.sh           what serving needs (scripts/serve.sh)
#   bash scripts/install.sh EXTRAS    plus extras from pyproject.toml: `dev` (tests, load
#                                     tests, bulk, tracing; scripts/test.sh), `bulk`, `s3`,
#                                     `tracing` (OpenTelemetry's OTLP exporter), `bulk,s3`
# Serving leaves the `bulk` extra out on purpose: Ray Data needs pandas, and every Serve
# process imports pandas when it is installed (~32 MiB of private memory each).
# The pinned CPU torch goes first: a plain `torch` requirement would pull CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
EXTRAS="${1:-}"
if [[ -n "$EXTRAS" && ! "$EXTRAS" =~ ^[a-z0-9,]+$ ]]; then
  echo "install.sh: EXTRAS is a comma-separated list of extras (dev, bulk, s3, tracing), not '$EXTRAS'" >&2
  exit 2
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${EXTRAS:+[$EXTRAS]}"
if [[ ",$EXTRAS," != *,dev,* ]]; then
  exit 0  # the JavaScript example below is for the tests
fi
# Debian's Chromium, for the test that opens /docs in a real headless browser
# (tests/unit/test_docs_page_browser.py): installed where apt-get runs as root, else a note.
if ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null &&
                                                   apt-get install -y -q chromium >/dev/null; }
  else
    echo "install.sh: chromium not found; the /docs browser test needs it (apt-get install chromium)" >&2
  fi
fi
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
