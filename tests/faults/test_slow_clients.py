"""Fault: slow clients (slowloris, stalled bodies) against `bash scripts/serve.sh`, with real
sockets, while an ordinary client keeps sending requests.

- Headers that trickle in (a request line, then a header line every 2 s: slowloris) are
  cut by HAProxy's `timeout http-request` (scripts/haproxy-loopback writes it): each such
  connection is answered 408 or closed, and the ordinary client gets only 200s meanwhile.
- A body that stops arriving is answered 408 once ``limits.body_timeout_s`` passes.
- A client cannot lift the server's request timeout: `x-request-timeout-seconds: 0`
  (Serve's "no timeout") is dropped at HAProxy, so a request to a model slower than
  `http_options.request_timeout_s` still ends at that timeout.

The run has its own Ray (RAY_ADDRESS=local) and ports, like tests/faults/test_lifecycle.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from tests.faults.test_lifecycle import Run, run_env
from tests.ports import stable_port

BODY_TIMEOUT_S = 2
REQUEST_TIMEOUT_S = 4
SLOW_BATCH_S = 12  # longer than REQUEST_TIMEOUT_S
HEADER_TIMEOUT_S = 10  # scripts/haproxy_loopback.py HTTP_REQUEST_TIMEOUT_S
SLOW_CONNECTIONS = 200


def app(args: dict) -> None:
    args["models"] = [{"id": "free", "source": "fake:8"},
                      {"id": "slow", "source": f"fake:8:0:{SLOW_BATCH_S}"}]
    args["default_model"] = "free"
    args["cpu_pool"]["preload"] = ["free"]
    args["limits"] = {"body_timeout_s": BODY_TIMEOUT_S}


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    directory = tmp_path_factory.mktemp("slow-clients")
    taken: set[int] = set()
    ports = {name: stable_port(taken) for name in ("http", "stats", "metrics")}
    env = run_env(directory, ports, app)
    with open(env["BLITZ_SERVE_CONFIG"]) as f:
        config = yaml.safe_load(f)
    config["http_options"]["request_timeout_s"] = REQUEST_TIMEOUT_S
    with open(env["BLITZ_SERVE_CONFIG"], "w") as f:
        yaml.safe_dump(config, f)
    run = Run("slow-clients", env, ports["http"], directory)
    try:
        run.wait_ready()
        yield ports["http"]
    finally:
        run.kill()


def embed(port: int, model: str = "free", headers: dict | None = None,
          timeout: float = 30) -> int:
    body = json.dumps({"texts": ["an ordinary request"], "model": model}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/embed", data=body,
        headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_trickling_headers_are_cut_and_others_are_served(port):
    slow = []
    for _ in range(SLOW_CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: blitz\r\n")
        slow.append(s)
    statuses: list[int] = []
    started = time.monotonic()
    while time.monotonic() - started < HEADER_TIMEOUT_S + 6:
        for s in slow:
            try:
                s.sendall(b"X-Trickle: 1\r\n")
            except OSError:
                pass  # cut already
        statuses.append(embed(port))
        time.sleep(1)
    assert statuses and set(statuses) == {200}
    cut = 0
    for s in slow:
        s.settimeout(5)
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            data = b""  # cut
        except TimeoutError:
            data = b"still open"
        cut += data == b"" or data.startswith(b"HTTP/1.1 408")
        s.close()
    assert cut == SLOW_CONNECTIONS


def test_a_body_that_stops_arriving_is_answered_408(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: blitz\r\ncontent-type: application/json\r\n"
                  b"content-length: 100000\r\n\r\n" + b'{"texts": ["' + b"a" * 1000)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = s.recv(4096)
            assert chunk, "closed without an answer"
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert embed(port) == 200


def test_a_client_cannot_lift_the_request_timeout(port):
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(embed(
        port, "slow", {"x-request-timeout-seconds": "0"}, timeout=SLOW_BATCH_S * 3)))
    thread.start()
    thread.join(SLOW_BATCH_S * 3)
    assert done and done[0] != 200  # ended by the server's timeout, not the model's answer
    assert embed(port) == 200
