"""Fault: requests in flight when a `bash scripts/serve.sh` run is stopped (SIGTERM, what
process managers send) all get their answer.

Ray 2.60's own shutdown (`serve shutdown`, `serve.shutdown()`, which `serve run` calls
on SIGINT) kills the HTTP front (HAProxy, SIGKILL) on its first step, so requests in
flight lose their connection even though their replicas drain. scripts/lifecycle.py
therefore drains first (`lifecycle.py drain`: each ingress replica told to stop,
deployments/draining.py) and only lets Serve shut down once no replica holds a request.

Two slow requests (a fake model whose batches take 4 s: one running, one queued on the
pool) are in flight when SIGTERM reaches serve.sh; both must answer 200 with their
embeddings, after the stop began, and the run must still stop completely. Meanwhile a
newcomer every 0.2 s (`GET /v1/models`: quick, so that the probe never waits behind the slow
model and misses the drain; the drain refuses every route alike) gets 200, 503 with
Retry-After (the drain: some must) or no connection (Serve gone), never 404 (what a deleted
application answered before: issue 54). The run has its own Ray (RAY_ADDRESS=local) and ports, like
tests/faults/test_lifecycle.py.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tests.faults.test_lifecycle import Run, run_env
from tests.ports import port_free, stable_port

BATCH_S = 4  # each batch of the fake model; both requests take ~2 batches in all


def slow_app(args: dict) -> None:
    args["models"] = [{"id": "slow", "source": f"fake:8:0:{BATCH_S}"}]
    args["default_model"] = "slow"
    args["cpu_pool"]["preload"] = ["slow"]


def embed(port: int, text: str) -> tuple[int, dict, float]:
    """POST /embed; (status, body, monotonic time of the answer)."""
    body = json.dumps({"texts": [text], "model": "slow"}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/embed", data=body,
                                     headers={"content-type": "application/json",
                                              "accept": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return reply.status, json.loads(reply.read()), time.monotonic()


def models(port: int) -> int:
    """GET /v1/models: a request that never waits on a model; its status."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as reply:
        return reply.status


def newcomers(port: int, stopped: threading.Event, seen: dict[str, int]) -> None:
    """A quick request every 0.2 s until ``stopped``: each outcome counted (``200``,
    ``503`` with a Retry-After, ``refused``, or anything else by its status or error). An
    embed here would wait behind the slow model, ~8 s, and could miss the drain entirely."""
    while not stopped.is_set():
        try:
            outcome = str(models(port))
        except urllib.error.HTTPError as e:
            outcome = str(e.code) if e.code != 503 or e.headers.get("retry-after") else \
                "503 without Retry-After"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            refused = isinstance(reason, ConnectionRefusedError | ConnectionResetError)
            outcome = "refused" if refused else f"{type(reason).__name__}"
        seen[outcome] = seen.get(outcome, 0) + 1
        stopped.wait(0.2)


def test_sigterm_drains_requests_in_flight(tmp_path):
    taken: set[int] = set()
    ports = {name: stable_port(taken) for name in ("http", "stats", "metrics")}
    run = Run("drain", run_env(tmp_path, ports, slow_app), ports["http"], tmp_path)
    try:
        ready_s = run.wait_ready()
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(embed, ports["http"], "one")
            time.sleep(0.5)  # the first batch has started: the second request queues
            second = pool.submit(embed, ports["http"], "two")
            time.sleep(1.0)  # both reached the server
            assert not first.done() and not second.done()
            seen: dict[str, int] = {}
            stopped = threading.Event()
            watcher = threading.Thread(target=newcomers, args=(ports["http"], stopped, seen))
            watcher.start()
            stop_began = time.monotonic()
            try:
                stop_s = run.stop(signal.SIGTERM)
            finally:
                stopped.set()
                watcher.join()
            replies = [first.result(), second.result()]
    finally:
        run.kill()
    print(f"\nrequests during the stop: {seen}")
    assert set(seen) <= {"200", "503", "refused"}, seen  # never 404: the app is kept
    assert seen.get("503"), seen  # the drain answered while the requests in flight ran
    for status, body, answered in replies:
        assert status == 200, body
        assert len(body["embeddings"]) == 1 and len(body["embeddings"][0]) == 8
        assert answered > stop_began, "answered before the stop: nothing was in flight"
    log = run.tail()
    assert "drained: 1 application(s) idle" in log, log
    assert all(port_free(p) for p in ports.values())
    print(f"\nshutdown drain: ready in {ready_s:.1f} s; SIGTERM -> everything gone in "
          f"{stop_s:.1f} s; answers {[r[2] - stop_began for r in replies]} s after it")
