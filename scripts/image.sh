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
#          $STOP_TIMEOUT_S) while a request of about $IN_FLIGHT_S runs: the image's
#          scripts/lifecycle.py drains, so that request must get its vectors, a small
#          request sent every 0.5 s meanwhile a correct 200 or a refusal (503 with
#          Retry-After, no connection; never Serve's 404), and the container must exit by
#          itself, status 0, within $STOP_BOUND_S.
#   stop   stop (SIGTERM: the same drain, at most $STOP_TIMEOUT_S) and remove the
#          container, if it runs.
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
STOP_TIMEOUT_S="${BLITZ_IMAGE_STOP_TIMEOUT_S:-150}"   # podman stop's SIGKILL after this:
                                                      # past the longest drain (~135 s)
STOP_BOUND_S="${BLITZ_IMAGE_STOP_BOUND_S:-30}"        # a clean stop takes less
IN_FLIGHT_S="${BLITZ_IMAGE_IN_FLIGHT_S:-10}"          # how long check's request in flight runs
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
  "${PODMAN[@]}" rm -f -t "$STOP_TIMEOUT_S" "$NAME" >/dev/null
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
    --stop-timeout "$STOP_TIMEOUT_S" \
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
  # The stop, with a request in flight: sized from a timed one to take $IN_FLIGHT_S (at
  # most one pool call, 128 texts), sent, and 0.5 s later `podman stop`; meanwhile a small
  # request every 0.5 s. The request in flight must get its vectors (the drain lets it
  # finish), each newcomer a correct 200 or a refusal (503, no connection), and the
  # container must exit 0 by itself.
  local took status=0 code
  took="$("$PYTHON" - "$HTTP_PORT" "$IN_FLIGHT_S" \
            "${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$NAME" <<'EOF'
import http.client, json, math, subprocess, sys, threading, time

port, slow_s, *stop = sys.argv[1:]
TEXT = "the quick brown fox jumps over the lazy dog " * 26  # ~240 tokens, under minilm's 256
# One pool call at most (serve_config.yaml's cpu_pool.max_batch_size): the pool replica
# holds the whole request, and a stopping replica finishes what it holds. A larger
# request's later pool calls, made once the drain began, get 503 + Retry-After.
MAX_TEXTS = 128


def post(texts, timeout=60.0, sent=None):
    """(status, embeddings or None) of POST /embed; OSError when no answer comes."""
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=timeout)
    try:
        conn.request("POST", "/embed", json.dumps({"texts": texts, "model": "minilm"}),
                     {"content-type": "application/json", "accept": "application/json"})
        if sent is not None:
            sent.set()
        reply = conn.getresponse()
        body = reply.read()
        return reply.status, json.loads(body)["embeddings"] if reply.status == 200 else None
    finally:
        conn.close()


def cos(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a)
                                                        * sum(y * y for y in b))


_, (reference,) = post(["hello world"])
t0 = time.monotonic()
post([f"{i} {TEXT}" for i in range(16)])
n = max(16, min(MAX_TEXTS, round(float(slow_s) * 16 / (time.monotonic() - t0))))
texts = ["hello world"] + [f"{i} {TEXT}" for i in range(n - 1)]
slow, later = {}, {}
sent, stopped = threading.Event(), threading.Event()


def in_flight():
    try:
        slow["status"], slow["vectors"] = post(texts, timeout=300, sent=sent)
    except Exception as e:  # a connection cut (OSError, IncompleteRead), a bad body
        slow["status"] = f"{type(e).__name__}: {e}"
    slow["at"] = time.monotonic()
    sent.set()


def newcomers():
    while not stopped.is_set():
        try:
            status, vectors = post(["hello world"], timeout=5)
            ok = status != 200 or (len(vectors) == 1 and cos(vectors[0], reference) > 0.999)
            outcome = str(status) if ok else "200 with a wrong vector"
        except (ConnectionRefusedError, TimeoutError):
            outcome = "refused"
        except Exception as e:  # a connection cut before its answer, a bad body
            outcome = type(e).__name__
        later[outcome] = later.get(outcome, 0) + 1
        stopped.wait(0.5)


client = threading.Thread(target=in_flight)
client.start()
sent.wait()
time.sleep(0.5)  # the request is at the pool replica
t_stop = time.monotonic()
watcher = threading.Thread(target=newcomers)
watcher.start()
subprocess.run(stop, check=True, stdout=subprocess.DEVNULL)
print(f"{time.monotonic() - t_stop:.1f}")  # the stop's time, for image.sh
stopped.set()
client.join()
watcher.join()
print(f"image.sh: stop: the request in flight ({n} texts): {slow['status']}, answered "
      f"{slow['at'] - t_stop:.1f} s after SIGTERM; new requests meanwhile: "
      f"{', '.join(f'{v} {k}' for k, v in sorted(later.items())) or 'none'}",
      file=sys.stderr)
failed = []
if slow["status"] != 200:
    failed.append("the request in flight got no 200")
elif len(slow["vectors"]) != n or cos(slow["vectors"][0], reference) <= 0.999:
    failed.append("the request in flight got wrong vectors")
if slow["at"] <= t_stop:
    failed.append("the request in flight was answered before the stop began: make it "
                  "slower (BLITZ_IMAGE_IN_FLIGHT_S)")
bad = {k: v for k, v in later.items() if k not in ("200", "503", "refused")}
if bad:
    failed.append(f"new requests during the stop got {bad}: not 200, 503 or refused")
for failure in failed:
    print(f"image.sh: stop: {failure}", file=sys.stderr)
sys.exit(1 if failed else 0)
EOF
)" || status=$?
  if [ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME")" = true ]; then
    "${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$NAME" >/dev/null  # the client failed first
  fi
  code="$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")"
  "${PODMAN[@]}" logs --tail 15 "$NAME" >&2 || true
  "${PODMAN[@]}" rm "$NAME" >/dev/null
  say "stop: exit status $code after ${took:-?} s"
  [ "$status" = 0 ] || die "stop: the request in flight or a newcomer was not answered as it must"
  [ "$code" = 0 ] || die "stop: exit status $code, not 0"
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
