#!/usr/bin/env bash
# The GPU checks on a lent accelerator machine (no network there), in two calls of the
# device tool, because one call carries at most 64 MiB (docs/benchmarks-history.md, "GPU
# pool on an NVIDIA H200"):
#   bash loadtest/gpu_device.sh encode   carry .gpu/a: the fp16 model (xz), pinned HF wheels
#   bash loadtest/gpu_device.sh serve    carry .gpu/b: Ray 2.60 (no Java jars) and Serve's deps
#     SERVE_ARGS (default --fast-path, as serve_config.yaml serves; "" for Serve's default
#     proxy; add --ingress-replicas N to pin the ingress replicas, default auto)
# The model and the installs of the first call stay on the machine for the second while it
# is warm. `python -m loadtest.gpu_bundles` builds .gpu/a and .gpu/b here (git-ignored:
# `echo /.gpu/ >> .git/info/exclude`). Results land in $OUT (the device tool's return
# folder) or ./gpu-out.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
MODEL=/tmp/blitz-gpu/model
pip_in() { [ -n "${NO_INSTALL:-}" ] && return 0; "$PY" -m pip install -q --no-index --disable-pip-version-check "$@" 2>&1 | grep -v -i warning || true; }

case "${1:?encode or serve}" in
  encode)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$PY" -V
    pip_in --find-links .gpu/a/whl transformers==5.24.0 \
      sentence-transformers==6.2.0 msgpack-numpy orjson pydantic==2.14.4
    mkdir -p "$MODEL"
    cp -r .gpu/a/model/. "$MODEL/"
    "$PY" -c "import lzma, shutil, sys
with lzma.open('.gpu/a/model.safetensors.xz') as src, open(sys.argv[1], 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 24)" "$MODEL/model.safetensors"
    "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|sentence|tokenizers|numpy|pydantic) ' || true
    "$PY" -m loadtest.gpu encode --source "$MODEL" --reference .gpu/a/reference.npy \
      --out "$OUT" --seconds "${SECONDS_PER_SIZE:-3}" ${ENCODE_ARGS:-} 2>&1 | tee "$OUT/encode.log"
    ;;
  serve)
    test -f "$MODEL/model.safetensors" || { echo "no model at $MODEL: run encode first on this machine"; exit 3; }
    pip_in --find-links .gpu/b/whl 'ray[serve]==2.60.0' 'starlette>=0.40' orjson msgpack-numpy
    "$PY" -m loadtest.gpu serve --source "$MODEL" --out "$OUT" ${SERVE_ARGS:---fast-path} \
      --seconds "${SECONDS_PER_PROFILE:-12}" --zero-delay "${ZERO_DELAY_S:-10}" 2>&1 \
      | grep -v -E '^\s*$' | tee "$OUT/serve.log"
    ;;
  *) echo "usage: $0 encode|serve" >&2; exit 2 ;;
esac
