"""Blitz on a real two-node Ray cluster, and the loss of the GPU node.

The cluster (tests/cluster/driver.py, in its own process with its own Ray temp dir) has a
head node with CPUs only and a worker node that declares one logical GPU. With
``gpu: auto`` the app builder binds the GPU pool; Ray must place it on the worker node
(where it finds no CUDA and falls back to CPU), while the ingress and the CPU pool ask
for the head's custom resource and stay on the head.

- Placement: the GPU pool's replica runs on the worker node, the CPU pool's on the head.
- Routing: small requests are answered by the CPU pool, large ones by the GPU pool
  (``x-blitz-pool``), and both answers equal in-process sentence-transformers.
- Fault: the worker node is killed outright while a client keeps sending small
  requests. Every small request, before and after, is a 200 from the CPU pool with the
  right embeddings; a large request is a correct 200 or a 503 with ``Retry-After``
  (the GPU pool has nowhere to run; ``ingress.pool_timeout_s`` bounds the wait), never
  a 500, and no request waits longer than the client's timeout.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from blitz import codecs
from tests.cluster.driver import HEAD_RESOURCE, PREFIX
from tests.ports import stable_port

ROOT = Path(__file__).resolve().parents[2]
START_S = 300  # two Ray nodes, Serve and two model loads on a 2-core machine
REMOVE_S = 120
STOP_S = 90
REQUEST_TIMEOUT_S = 60  # no request may take longer: a hang fails the test
POOL_TIMEOUT_S = 10  # the ingress's bound on one pool call (the lost GPU pool's requests)
MSGPACK = {"content-type": "application/msgpack"}
FAST_PATH_ENV = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_ADDRESS")


def cluster_app(model_dir: Path) -> dict:
    on_head = {HEAD_RESOURCE: 0.01}
    def deployment(**actor: object) -> dict:
        return {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
                "ray_actor_options": {"num_cpus": 0.1, **actor}}

    return {
        "models": [{"id": "tiny", "source": str(model_dir)}],
        "gpu": "auto",
        "routing": {"gpu_min_batch": 10},
        # the model is resident before `ready`: a first request that loads it (torch
        # imported then) can outlast POOL_TIMEOUT_S on a 2-core machine after a long suite
        "cpu_pool": {"torch_threads": 1, "max_batch_size": 16, "preload": ["tiny"],
                     "deployment": deployment(resources=on_head)},
        "gpu_pool": {"torch_threads": 1, "max_batch_size": 64, "preload": ["tiny"],
                     "deployment": deployment(num_gpus=1)},
        "ingress": {"pool_timeout_s": POOL_TIMEOUT_S, "deployment": {
            "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1, "resources": on_head}}},
    }


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


class ClusterRun:
    """The driver process, its event lines, and a cleanup that leaves nothing behind."""

    def __init__(self, app: dict, log: Path):
        self.temp = tempfile.mkdtemp(prefix="bcl-", dir="/tmp")  # short: Ray's socket paths
        env = {k: v for k, v in os.environ.items() if k not in FAST_PATH_ENV}
        env.update(RAY_TMPDIR=self.temp, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                            env.get("PYTHONPATH")])))
        self.log = log
        spec = {"http_port": stable_port(set()), "app": app}
        with open(log, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.cluster.driver", json.dumps(spec)], cwd=ROOT,
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True, start_new_session=True)
        self.events: queue.Queue[dict | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                self.events.put(json.loads(line[len(PREFIX):]))
        self.events.put(None)

    def wait_for(self, event: str, timeout: float) -> dict:
        try:
            message = self.events.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no {event!r} from the cluster driver in {timeout} s\n{self.tail()}")
        if message is None or message["event"] != event:
            pytest.fail(f"cluster driver: expected {event!r}, got {message}\n{self.tail()}")
        return message

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        """``stop`` (Serve, driver and nodes shut down), then SIGKILL for anything left in
        the driver's session: only the processes this run started."""
        try:
            self.send("stop")
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pass
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        self.reader.join(10)
        self.proc.stdout.close()  # type: ignore[union-attr]
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tiny_models, tmp_path_factory):
    run = ClusterRun(cluster_app(tiny_models["tiny-a"]),
                     tmp_path_factory.mktemp("cluster") / "driver.log")
    try:
        run.ready = run.wait_for("ready", START_S)
        yield run
    finally:
        run.close()


def texts(n: int, salt: str) -> list[str]:
    return [f"{salt} sentence {i} about topic {i * 7 % 13}" for i in range(n)]


def embed(http: httpx.Client, batch: list[str]) -> httpx.Response:
    return http.post("/embed", content=codecs.pack({"texts": batch, "model": "tiny"}),
                     headers=MSGPACK)


def assert_answer(response: httpx.Response, pool: str, expected: np.ndarray) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["x-blitz-pool"] == pool
    got = codecs.unpack(response.content)["embeddings"]
    assert got.shape == expected.shape
    assert np.allclose(got, expected, atol=1e-4)


class SmallRequests:
    """One client sending single-text requests back to back until stopped."""

    def __init__(self, url: str):
        self.url = url
        self.answers: list[tuple[int, str | None, str, np.ndarray | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
            for i in range(1_000_000):
                if self.stop.is_set():
                    return
                text = f"background request {i}"
                try:
                    r = embed(http, [text])
                except httpx.HTTPError as exc:  # a hang or a dropped connection
                    self.answers.append((-1, None, repr(exc), None))
                    continue
                ok = r.status_code == 200
                self.answers.append((r.status_code, r.headers.get("x-blitz-pool"),
                                     text if ok else r.text,
                                     codecs.unpack(r.content)["embeddings"] if ok else None))

    def __enter__(self) -> SmallRequests:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        self.thread.join(REQUEST_TIMEOUT_S + 5)


def test_gpu_pool_runs_on_the_gpu_node_and_the_cpu_pool_survives_its_loss(
        cluster, reference, tiny_models):
    from blitz.loading.load import resolve_device

    ready = cluster.ready
    assert ready["cluster_gpus"] == 1
    assert ready["head"] != ready["worker"]
    assert ready["gpu_pool"]["node_id"] == ready["worker"]
    assert ready["gpu_pool"]["device"] == resolve_device("cuda")  # CPU here: no CUDA
    assert ready["cpu_pool"]["node_id"] == ready["head"]
    model = reference("tiny-a", tiny_models["tiny-a"])

    def expected(batch: list[str]) -> np.ndarray:
        return model.encode(batch, normalize_embeddings=True)

    small, large = texts(3, "small"), texts(40, "large")
    with httpx.Client(base_url=ready["url"], timeout=REQUEST_TIMEOUT_S) as http:
        assert_answer(embed(http, small), "cpu", expected(small))
        assert_answer(embed(http, large), "gpu", expected(large))

        with SmallRequests(ready["url"]) as load:
            cluster.send("remove")
            assert cluster.wait_for("removed", REMOVE_S)["alive_nodes"] == 1
            seen = len(load.answers)
            for round_ in range(3):
                batch = texts(3, f"after {round_}")
                assert_answer(embed(http, batch), "cpu", expected(batch))
                r = embed(http, large)
                if r.status_code == 503:
                    assert int(r.headers["retry-after"]) > 0
                    assert r.json()["error"]["type"] in ("unavailable_error", "overloaded_error")
                else:
                    assert r.status_code == 200, r.text
                    assert np.allclose(codecs.unpack(r.content)["embeddings"],
                                       expected(large), atol=1e-4)
        assert len(load.answers) > seen  # the client kept being answered after the loss

    failures = [a[:3] for a in load.answers if a[0] != 200 or a[1] != "cpu"]
    assert not failures, failures[:5]
    sent = [a[2] for a in load.answers]
    assert np.allclose(np.concatenate([a[3] for a in load.answers]), expected(sent), atol=1e-4)
