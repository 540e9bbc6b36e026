"""A stopping server answers 503 with Retry-After, never Serve's 404 (issue 54, a low).

scripts/lifecycle.py's drain tells each ingress replica to stop (deployments/draining.py,
through Ray's GCS key-value store, faked here by a dict); from then on every new HTTP
request gets 503 + Retry-After in Blitz's error shape, health checks included (balancers
drop the replica), while those in flight finish and are counted; the replica reports
itself idle once none is left, and the drain then lets Serve shut down without deleting
the application (whose route Serve would take away at once: 404s). A lapsed flag serves
again; an application that is not Blitz's is deleted as before."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from blitz.http.api import HttpApi
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.runtime.draining import Drain
from blitz.settings.config import BlitzSettings
from deployments import draining
from tests.api_client import api_client, api_for

ROOT = Path(__file__).resolve().parents[2]


class GatedDispatcher(ReplicaDispatcher):
    """Holds every job until ``gate`` opens: a request in flight during the stop."""

    def __init__(self, settings):
        super().__init__(settings)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def submit(self, pool, model_id, job):
        self.entered.set()
        await self.gate.wait()
        return await super().submit(pool, model_id, job)


def gated_api() -> tuple[HttpApi, GatedDispatcher]:
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:8"}]})
    dispatcher = GatedDispatcher(settings)
    return api_for(settings, dispatcher), dispatcher


def test_a_stopping_drain_refuses_and_counts():
    drain = Drain()
    drain.refuse_if_stopping()  # serving: nothing raised
    with drain.held():
        assert drain.in_flight == 1
        drain.begin()
        assert not drain.idle
        with pytest.raises(Exception) as refused:
            drain.refuse_if_stopping()
    assert refused.value.status == 503 and refused.value.retry_after_s
    assert drain.in_flight == 0 and drain.idle
    drain.end()
    assert not drain.stopping and not drain.idle


async def test_requests_during_the_stop_get_503_with_retry_after_while_in_flight_ones_finish():
    api, dispatcher = gated_api()
    async with api_client(api) as client:
        in_flight = asyncio.ensure_future(client.post("/embed", json={"texts": ["a b"]}))
        await dispatcher.entered.wait()
        assert api.drain.in_flight == 1
        api.drain.begin()  # the stop begins: what DrainWatch does when it hears it
        for method, path, body in [("POST", "/embed", {"texts": ["c"]}),
                                   ("POST", "/v1/embeddings", {"input": "c"}),
                                   ("GET", "/health", None), ("GET", "/ready", None),
                                   ("GET", "/no-such-route", None)]:
            reply = await client.request(method, path, json=body)
            assert reply.status_code == 503, (path, reply.text)  # on main: 404 once deleted
            assert int(reply.headers["retry-after"]) >= 1
            assert "stopping" in reply.json()["error"]["message"]
            assert reply.headers["x-request-id"]
        assert not api.drain.idle  # the first still runs
        dispatcher.gate.set()
        first = await in_flight
    assert first.status_code == 200 and len(first.json()["embeddings"]) == 1
    assert api.drain.idle


def text(key: str | bytes) -> str:
    return key.decode() if isinstance(key, bytes) else key  # Ray takes either


class FakeKv:
    """Ray's internal KV functions over a dict: (namespace, key) -> value."""

    def __init__(self):
        self.data: dict[tuple[str, str], bytes] = {}

    def get(self, key, namespace=None):
        return self.data.get((namespace, text(key)))

    def put(self, key, value, overwrite=True, namespace=None):
        self.data[(namespace, text(key))] = value

    def delete(self, key, namespace=None):
        self.data.pop((namespace, text(key)), None)

    def list(self, prefix, namespace=None):
        return [k.encode() for (n, k) in self.data if n == namespace and k.startswith(prefix)]


@pytest.fixture
def kv(monkeypatch):
    fake = FakeKv()
    monkeypatch.setattr(draining, "_internal_kv_get", fake.get)
    monkeypatch.setattr(draining, "_internal_kv_put", fake.put)
    import ray.experimental.internal_kv as internal_kv

    for name, function in (("_internal_kv_get", fake.get), ("_internal_kv_put", fake.put),
                           ("_internal_kv_del", fake.delete),
                           ("_internal_kv_list", fake.list)):
        monkeypatch.setattr(internal_kv, name, function)
    return fake


def test_the_watch_begins_the_stop_reports_idleness_and_serves_again_once_it_lapses(kv):
    drain = Drain()
    watch = draining.DrainWatch(drain, "blitz", "r1")
    space = draining.namespace("blitz")
    watch.tick()
    assert not drain.stopping and (space, "idle:r1") not in kv.data
    kv.put(draining.STOPPING, f"{time.time() + 60}".encode(), namespace=space)
    with drain.held():
        watch.tick()
        assert drain.stopping and kv.data[(space, "idle:r1")] == b"0"
    watch.tick()
    assert kv.data[(space, "idle:r1")] == b"1"
    kv.put(draining.STOPPING, f"{time.time() - 1}".encode(), namespace=space)  # lapsed
    watch.tick()
    assert not drain.stopping


def test_the_watch_reads_seldom_while_serving_and_often_while_stopping(kv, monkeypatch):
    drain = Drain()
    watch = draining.DrainWatch(drain, "blitz", "r1")
    assert watch.next_tick_s() == draining.POLL_S >= 1.0  # idle: one read in seconds
    kv.put(draining.STOPPING, f"{time.time() + 60}".encode(),
           namespace=draining.namespace("blitz"))
    watch.tick()
    assert watch.next_tick_s() == draining.STOPPING_POLL_S < draining.POLL_S
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    heard_s = importlib.import_module("lifecycle").HEARD_S
    sys.modules.pop("lifecycle", None)
    assert draining.POLL_S < heard_s / 2  # a replica hears the stop before the drain gives up


@pytest.fixture
def lifecycle(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = importlib.import_module("lifecycle")
    monkeypatch.setattr(module, "DRAIN_S", 10.0)
    monkeypatch.setattr(module, "HEARD_S", 0.5)
    yield module
    sys.modules.pop("lifecycle", None)


def fake_serve(monkeypatch, apps: dict[str, int | None]) -> list[str]:
    """serve.status() of ``apps`` (name -> RUNNING ingress replicas, None: no Blitz
    ingress) and serve.delete(), which records and removes."""
    from ray import serve

    deleted: list[str] = []

    def status():
        return SimpleNamespace(applications={
            app: SimpleNamespace(deployments={} if n is None else {
                "Ingress": SimpleNamespace(replica_states={"RUNNING": n})})
            for app, n in apps.items() if app not in deleted})

    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(serve, "delete", lambda app, _blocking=True: deleted.append(app))
    return deleted


def test_the_drain_waits_for_idle_ingresses_and_deletes_no_blitz_app(lifecycle, kv,
                                                                     monkeypatch):
    deleted = fake_serve(monkeypatch, {"blitz": 2, "other": None})
    space = draining.namespace("blitz")
    kv.put("idle:stale", b"0", namespace=space)  # an earlier stop's report: cleared
    replicas = {name: Drain() for name in ("r1", "r2")}
    watches = [draining.DrainWatch(d, "blitz", name) for name, d in replicas.items()]
    held = replicas["r2"].held()
    held.__enter__()  # r2 has a request in flight for a while
    ticks = 0

    def sleep(_s):  # time passes: the replicas' watches tick
        nonlocal ticks
        ticks += 1
        for watch in watches:
            watch.tick()
        if ticks == 3:
            held.__exit__(None, None, None)

    monkeypatch.setattr(lifecycle.time, "sleep", sleep)
    assert lifecycle._drain_apps() == 0
    assert all(d.stopping for d in replicas.values()) and ticks >= 4
    assert deleted == ["other"]  # Blitz's application stays until Serve's shutdown
    assert (space, "idle:stale") not in kv.data


def test_an_application_whose_ingress_never_answers_is_deleted_as_before(lifecycle, kv,
                                                                         monkeypatch):
    deleted = fake_serve(monkeypatch, {"blitz": 1})
    real_sleep = time.sleep
    monkeypatch.setattr(lifecycle.time, "sleep", lambda s: real_sleep(min(s, 0.05)))
    assert lifecycle._drain_apps() == 0
    assert deleted == ["blitz"]


async def test_handle_calls_in_flight_are_counted_so_the_stop_waits_for_them():
    from deployments.ingress import Ingress

    class Replica:  # the ingress's handle method on a service, without Ray
        embed = Ingress.func_or_class.embed

        def __init__(self, service):
            self.service = service
            self.drain = Drain()

    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:8"}]})
    dispatcher = GatedDispatcher(settings)
    replica = Replica(EmbeddingService(settings, dispatcher))
    call = asyncio.ensure_future(replica.embed(["a"], model="fake"))
    await dispatcher.entered.wait()
    replica.drain.begin()
    assert replica.drain.in_flight == 1 and not replica.drain.idle
    dispatcher.gate.set()
    assert (await call).embeddings.shape == (1, 8)
    assert replica.drain.idle
