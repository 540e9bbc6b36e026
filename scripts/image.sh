#!/usr/bin/env bash
# Build the Dockerfile's image with podman, run it, and check it (docs/operations.md,
# "The image, built and run with podman"). For a machine with no image registry:
#
#   bash scripts/image.sh [build|run|check|stop]...   (no argument: build run check)
#
#   build  a local base image first when there is none (debootstrap of Debian bookworm,
#          whose python3 is 3.11, `podman import`ed as $BASE), then `podman build` with
#          --build-arg BASE=$BASE and the host's wheel directory ($WHEEL_DIR, which holds
#          a CPU torch) mounted into the build instead of the CPU torch index, and pip
#          trusting the host's CAs ($PIP_CERT, else Debian's bundle). Podman
#          keeps the layers: a rerun with nothing changed takes seconds.
#   run    start the image as container $NAME (any earlier one of that name that this
#          script made is removed first), its 8000 and 9000 published on 127.0.0.1 at
#          $HTTP_PORT and $GRPC_PORT, and wait for GET /ready to answer 200.
#   check  POST /embed (JSON) answers one 384-value vector, GET /ready 200, gRPC Embed
#          answers a vector, then `podman stop` (SIGTERM, then SIGKILL after
#          $STOP_TIMEOUT_S): the container must exit by itself, with status 0 or 15
#          (`serve run`'s SIGTERM exit), within $STOP_BOUND_S.
#   stop   stop and remove the container, if it runs.
#
# Prints the build time, the image's size, the time from `podman run` to /ready's 200 and
# the stop's. Touches only what it makes, all labelled blitz.image.sh=1: the base image,
# the image and the container. Needs root (podman's rootful storage, debootstrap), and
# runs podman with runc (crun was found to fail on hybrid cgroups), cgroupfs where systemd
# is not running, and nofile/nproc limits at most this shell's hard ones (podman asks for
# 1,048,576 open files by default, which a lower hard limit refuses).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${BLITZ_IMAGE:-localhost/blitz:0.1.0}"
BASE="${BLITZ_IMAGE_BASE:-localhost/blitz-base:bookworm}"
NAME="${BLITZ_IMAGE_CONTAINER:-blitz-image-sh}"
HTTP_PORT="${BLITZ_IMAGE_HTTP_PORT:-18000}"
GRPC_PORT="${BLITZ_IMAGE_GRPC_PORT:-19000}"
WHEEL_DIR="${BLITZ_WHEEL_DIR:-/opt/wheels}"          # holds torch-2.13.0+cpu-cp311-*.whl
MIRROR="${BLITZ_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
WORK="${BLITZ_IMAGE_WORK:-/var/tmp/blitz-image}"      # debootstrap's root; the build's pip config
CA="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"  # the CAs the host's pip trusts
READY_TIMEOUT_S="${BLITZ_IMAGE_READY_TIMEOUT_S:-300}"
STOP_TIMEOUT_S="${BLITZ_IMAGE_STOP_TIMEOUT_S:-60}"    # podman stop's SIGKILL after this
STOP_BOUND_S="${BLITZ_IMAGE_STOP_BOUND_S:-30}"        # a clean stop takes less
LABEL=blitz.image.sh=1
PYTHON="${PYTHON:-.venv/bin/python}"                  # the host's, for the gRPC check

say() { echo "image.sh: $*" >&2; }
die() { say "$*"; exit 1; }

limit() {  # a soft limit to ask for: $2, or the hard limit when that is lower
  local hard; hard="$(ulimit -H "$1")"
  if [ "$hard" = unlimited ] || [ "$hard" -gt "$2" ]; then echo "$2"; else echo "$hard"; fi
}
NOFILE="$(limit -n 16384)"
NPROC="$(limit -u 32768)"  # podman's own default; above it runc's setrlimit was refused here
ULIMITS=(--ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC")
PODMAN=(podman --runtime runc)
[ -d /run/systemd/system ] || PODMAN+=(--cgroup-manager cgroupfs)

ours() {  # whether image or container $2 ($1: image|container) carries our label
  [ "$("${PODMAN[@]}" "$1" inspect --format '{{index .Config.Labels "blitz.image.sh"}}' \
        "$2" 2>/dev/null)" = 1 ]
}

make_base() {
  if "${PODMAN[@]}" image exists "$BASE"; then
    ours image "$BASE" || die "$BASE exists and is not this script's; set BLITZ_IMAGE_BASE"
    return
  fi
  command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
  local t0=$SECONDS root="$WORK/rootfs"
  rm -rf "$root" && mkdir -p "$root"
  say "making $BASE: debootstrap bookworm from $MIRROR"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed ($WORK/debootstrap.log)"; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "${PODMAN[@]}" import \
    --change "LABEL $LABEL" --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    - "$BASE" >/dev/null
  rm -rf "$root"
  say "base $BASE made in $((SECONDS - t0)) s"
}

build() {
  command -v podman >/dev/null || die "podman not found (apt-get install podman runc)"
  ls "$WHEEL_DIR"/torch-2.13.0*cp311*.whl >/dev/null 2>&1 \
    || die "no torch 2.13.0 wheel for Python 3.11 in $WHEEL_DIR (set BLITZ_WHEEL_DIR)"
  make_base
  local old t0=$SECONDS
  old="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
  if [ -n "$old" ] && ! ours image "$IMAGE"; then
    die "$IMAGE exists and is not this script's; set BLITZ_IMAGE"
  fi
  # Host network: pip reaches the package registries the host does, and trusts the CAs
  # the host's pip does (a proxy's own CA, say) through a pip config mounted where pip
  # looks (/etc/xdg/pip), for the build only: neither mount is part of the image.
  mkdir -p "$WORK/pip"
  cp "$CA" "$WORK/pip/ca.crt"
  printf '[global]\ncert = /etc/xdg/pip/ca.crt\n' >"$WORK/pip/pip.conf"
  "${PODMAN[@]}" build --layers --network host "${ULIMITS[@]}" --label "$LABEL" \
    --volume "$WHEEL_DIR:/wheels:ro" --volume "$WORK/pip:/etc/xdg/pip:ro" \
    --build-arg "BASE=$BASE" \
    --build-arg WHEEL_DIR=/wheels --build-arg TORCH_INDEX= \
    -t "$IMAGE" -f Dockerfile .
  local new; new="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE")"
  if [ -n "$old" ] && [ "$old" != "$new" ]; then  # the previous build, now untagged
    "${PODMAN[@]}" rmi "$old" >/dev/null 2>&1 || true
  fi
  local size; size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")"
  say "build: $((SECONDS - t0)) s; image $IMAGE: $((size / 1000000)) MB"
}

remove_container() {
  "${PODMAN[@]}" container exists "$NAME" || return 0
  ours container "$NAME" || die "container $NAME exists and is not this script's"
  "${PODMAN[@]}" rm -f -t 10 "$NAME" >/dev/null
}

http_status() {  # the status of GET $1, or 000 when nothing answers
  "$PYTHON" - "$1" <<'EOF'
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print("000")
EOF
}

run() {
  remove_container
  local t0; t0="$(date +%s.%N)"
  "${PODMAN[@]}" run -d --name "$NAME" --label "$LABEL" "${ULIMITS[@]}" --shm-size=2g \
    -p "127.0.0.1:$HTTP_PORT:8000" -p "127.0.0.1:$GRPC_PORT:9000" "$IMAGE" >/dev/null
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until [ "$(http_status "http://127.0.0.1:$HTTP_PORT/ready")" = 200 ]; do
    if [ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME")" != true ]; then
      "${PODMAN[@]}" logs --tail 40 "$NAME" >&2 || true
      die "the container exited before /ready answered 200"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      "${PODMAN[@]}" logs --tail 40 "$NAME" >&2 || true
      die "/ready did not answer 200 within $READY_TIMEOUT_S s"
    fi
    sleep 1
  done
  say "run: /ready 200 after $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s"
}

check() {
  "${PODMAN[@]}" container exists "$NAME" || die "no container $NAME: run it first"
  "$PYTHON" - "$HTTP_PORT" "$GRPC_PORT" <<'EOF'
import json, sys, urllib.request
import grpc
from blitz.grpc_api import rpc_table, tei_pb2 as pb

http, grpc_port = sys.argv[1:]
body = json.dumps({"texts": ["hello world"], "model": "minilm"}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{http}/embed", data=body, headers={
    "content-type": "application/json", "accept": "application/json"})
with urllib.request.urlopen(request, timeout=60) as r:
    vectors = json.load(r)["embeddings"]
assert len(vectors) == 1 and len(vectors[0]) == 384, f"/embed: {len(vectors)} vectors"
with urllib.request.urlopen(f"http://127.0.0.1:{http}/ready", timeout=10) as r:
    assert r.status == 200, f"/ready: {r.status}"
with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
    embed = rpc_table.client_method(channel, "Embed")
    reply = embed(pb.EmbedRequest(inputs="hello world"), metadata=(("model", "minilm"),),
                  timeout=60)
assert len(reply.embeddings) == 384, f"gRPC Embed: {len(reply.embeddings)} values"
print("image.sh: check: /embed 384 values, /ready 200, gRPC Embed 384 values",
      file=sys.stderr)
EOF
  local t0; t0="$(date +%s.%N)"
  "${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$NAME" >/dev/null
  local took code
  took="$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}")"
  code="$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")"
  "${PODMAN[@]}" logs --tail 15 "$NAME" >&2 || true
  "${PODMAN[@]}" rm "$NAME" >/dev/null
  say "stop: exit status $code after $took s"
  [ "$code" = 0 ] || [ "$code" = 15 ] || die "stop: exit status $code, not 0 or 15"
  awk "BEGIN {exit !($took < $STOP_BOUND_S)}" || die "stop: $took s, not under $STOP_BOUND_S s"
  say "check: passed"
}

[ "$(id -u)" = 0 ] || die "run as root (rootful podman, debootstrap)"
[ $# -gt 0 ] || set -- build run check
for step in "$@"; do
  case "$step" in
    build) build ;;
    run) run ;;
    check) check ;;
    stop) remove_container ;;
    *) die "unknown step '$step' (build, run, check, stop)" ;;
  esac
done
