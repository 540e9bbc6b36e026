"""A request's priority from every entry point to the jobs it sends (no Ray): HTTP's
``x-blitz-priority`` header and body ``priority`` (the header wins), the handle API's
``priority=``, gRPC metadata, the Python client; jobs carry it across the hop, and a pool
replica's queue runs high before low. What HTTP and gRPC callers ask for is held to their
API key's ceiling (``auth.max_priority``, ``auth.priority_grants``; a gateway's header is
taken as sent with ``auth.trust_priority_header``); the handle's callers are trusted."""

from __future__ import annotations

import asyncio
import contextlib
import pickle

import grpc
import pytest

from blitz.client import AsyncClient
from blitz.errors import InvalidValue
from blitz.hop_messages import (
    HIGH,
    LOW,
    NORMAL,
    PRIORITIES,
    ClassifyJob,
    EmbedJob,
    RerankJob,
    priority_level,
    priority_of,
    with_priority,
)
from blitz.ingress.keys import key_id
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.pool.batching import Batcher
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.pool.replica import PoolReplica
from blitz.runtime.draining import Drain
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from deployments.ingress import Ingress
from tests.api_client import api_client, api_transport, tei_servicer
from tests.waiting import wait_until_async

ARGS = {"models": [{"id": "fake", "source": "fake:16"},
                   {"id": "ce", "source": "fake:4", "kind": "cross-encoder"}],
        "cpu_pool": {"max_batch_size": 2}}
SETTINGS = BlitzSettings.from_args(ARGS)  # keys off: everyone's ceiling is normal
ANYONE_HIGH = BlitzSettings.from_args({**ARGS, "auth": {"max_priority": "high"}})
SEARCH, BULK, BATCH, OTHER = "search-key", "bulk-key", "batch-key", "other-key"
KEYED = BlitzSettings.from_args({**ARGS, "auth": {
    "api_keys": [SEARCH, BULK, BATCH, OTHER],
    "priority_grants": {key_id(SEARCH): "high", BATCH: "low"}}})  # by id, or the key itself


class JobRecordingDispatcher(ReplicaDispatcher):
    """Runs every job on the replica in process and keeps each job's priority level."""

    def __init__(self, settings=SETTINGS):
        super().__init__(settings)
        self.levels: list[int] = []

    async def submit(self, pool, model_id, job):
        self.levels.append(job.priority)
        return await super().submit(pool, model_id, job)


def service_and_levels(settings: BlitzSettings = SETTINGS
                       ) -> tuple[EmbeddingService, list[int], list[RequestRecord]]:
    dispatcher = JobRecordingDispatcher(settings)
    observed: list[RequestRecord] = []
    service = EmbeddingService(settings, dispatcher,
                               observer=lambda record, status, s: observed.append(record))
    return service, dispatcher.levels, observed


# ---- the value and the jobs ----------------------------------------------------------------

def test_priority_names_are_levels_and_anything_else_is_a_422():
    assert [priority_level(n) for n in ("high", "normal", "low")] == [HIGH, NORMAL, LOW]
    assert priority_level(None) == NORMAL
    for bad in ("urgent", "", "LOW", 1, True, ["low"]):
        with pytest.raises(InvalidValue, match="priority must be one of high, normal, low"):
            priority_level(bad)
    with pytest.raises(InvalidValue) as caught:
        priority_level("2", param="x-blitz-priority")
    assert caught.value.param == "x-blitz-priority"


def test_every_job_carries_a_priority_across_the_hop():
    jobs = [EmbedJob(texts=["a"]), RerankJob("q", ["d"]), ClassifyJob([["a"]])]
    assert [job.priority for job in jobs] == [NORMAL] * 3
    low = [with_priority(job, LOW) for job in jobs]
    assert [priority_of(pickle.loads(pickle.dumps(job))) for job in low] == [LOW] * 3
    assert low[1] == RerankJob("q", ["d"], priority=LOW)
    same = EmbedJob(texts=["a"])
    assert with_priority(same, NORMAL) is same  # nothing copied for the default
    assert priority_of("not a job") == NORMAL


def test_a_job_pickled_without_a_priority_reads_normal():
    """A rolling redeploy: an older ingress's jobs have no ``priority`` of their own."""
    job = EmbedJob(texts=["a"], priority=LOW)
    object.__delattr__(job, "priority")
    assert priority_of(pickle.loads(pickle.dumps(job))) == NORMAL


# ---- the service and the handle API ------------------------------------------------------

class IngressMethods:
    embed = Ingress.func_or_class.embed
    rerank = Ingress.func_or_class.rerank

    def __init__(self, service: EmbeddingService):
        self.service = service
        self.drain = Drain()  # the replica's stop (blitz.runtime.draining)


async def test_the_records_priority_goes_on_every_job_of_the_request():
    service, levels, _ = service_and_levels()
    await service.embed(["a", "b", "c"], model="fake", record=RequestRecord("/embed",
                                                                            priority=LOW))
    assert levels == [LOW, LOW]  # two jobs of the pool's batch limit
    await service.embed(["a"], model="fake")
    assert levels[2:] == [NORMAL]


async def test_handle_calls_take_a_priority_and_are_observed_once():
    service, levels, observed = service_and_levels()
    replica = IngressMethods(service)
    await replica.embed(["a"], model="fake", priority="low")
    await replica.rerank("q", ["a", "b"], model="ce", priority="high")
    await replica.embed(["a"], model="fake")
    assert levels == [LOW, HIGH, NORMAL]
    assert [(r.route, r.priority) for r in observed] == [
        ("handle.embed", LOW), ("handle.rerank", HIGH), ("handle.embed", NORMAL)]
    with pytest.raises(InvalidValue):
        await replica.embed(["a"], model="fake", priority="bulk")
    assert observed[-1].error == "invalid_value" and len(levels) == 3


# ---- HTTP ----------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def http_on(settings: BlitzSettings):
    service, levels, _ = service_and_levels(settings)
    async with api_client(service) as client:
        client.levels = levels  # type: ignore[attr-defined]
        yield client


@pytest.fixture
async def http():
    async with http_on(SETTINGS) as client:
        yield client


@pytest.mark.parametrize(("settings", "headers", "body", "level"), [
    (SETTINGS, {}, {}, NORMAL),
    (SETTINGS, {}, {"priority": "low"}, LOW),
    (SETTINGS, {"x-blitz-priority": "LOW"}, {"priority": "normal"}, LOW),  # the header wins
    (ANYONE_HIGH, {"x-blitz-priority": "high"}, {}, HIGH),
    (ANYONE_HIGH, {"x-blitz-priority": "High"}, {"priority": "low"}, HIGH),
])
async def test_http_takes_the_header_else_the_body(settings, headers, body, level):
    async with http_on(settings) as http:
        r = await http.post("/embed", json={"texts": ["a"], "model": "fake", **body},
                            headers=headers)
    assert r.status_code == 200, r.text
    assert http.levels == [level]
    assert r.headers.get("x-blitz-priority") == (PRIORITIES[level] if headers or body
                                                 else None)  # the level it ran at


@pytest.mark.parametrize(("headers", "body"), [
    ({"x-blitz-priority": "high"}, {}), ({}, {"priority": "high"}),
    ({"x-blitz-priority": "high"}, {"priority": "high"})])
async def test_with_keys_off_a_self_declared_high_runs_at_normal_and_says_so(http, headers,
                                                                             body):
    r = await http.post("/embed", json={"texts": ["a"], "model": "fake", **body},
                        headers=headers)
    assert r.status_code == 200, r.text  # clamped, not refused: clients that always send
    assert http.levels == [NORMAL]  # high keep working
    assert r.headers["x-blitz-priority"] == "normal"


@pytest.mark.parametrize(("key", "asked", "level"), [
    (SEARCH, "high", HIGH),  # granted high (named by its id)
    (SEARCH, None, NORMAL),  # a grant is a ceiling: nothing asked is normal
    (SEARCH, "low", LOW),
    (OTHER, "high", NORMAL),  # no grant: max_priority, normal
    (OTHER, "low", LOW),
    (BATCH, "high", LOW),  # held to low (named by the key itself)
    (BATCH, None, LOW),
])
async def test_a_keys_requests_are_held_to_its_ceiling(key, asked, level):
    async with http_on(KEYED) as http:
        for where in ("header", "body"):
            r = await http.post(
                "/embed", json={"texts": ["a"], "model": "fake",
                                **({"priority": asked} if asked and where == "body" else {})},
                headers={"authorization": f"Bearer {key}",
                         **({"x-blitz-priority": asked} if asked and where == "header"
                            else {})})
            assert r.status_code == 200, r.text
            assert r.headers.get("x-blitz-priority") == (PRIORITIES[level] if asked or
                                                         level != NORMAL else None)
    assert http.levels == [level, level]


def test_grants_name_keys_by_id_or_by_themselves_and_a_bad_id_is_refused():
    from blitz.ingress.keys import ApiKeys

    keys = ApiKeys(KEYED.auth)
    assert [keys.ceiling(i) for i in range(4)] == [HIGH, NORMAL, LOW, NORMAL]
    assert keys.ceiling(-1) == NORMAL  # no key: max_priority
    assert key_id(SEARCH).startswith("sha256:") and len(key_id(SEARCH)) == 7 + 16
    for bad in ("sha256:12", "sha256:" + "G" * 16, " "):
        with pytest.raises(ValueError, match="priority_grants"):
            BlitzSettings.from_args({**ARGS, "auth": {"priority_grants": {bad: "high"}}})
    with pytest.raises(ValueError):
        BlitzSettings.from_args({**ARGS, "auth": {"priority_grants": {SEARCH: "urgent"}}})


async def test_a_gateways_header_is_taken_as_sent_when_trusted_and_the_body_is_not():
    trusted = BlitzSettings.from_args({**ARGS, "auth": {
        "api_keys": [SEARCH, BULK], "trust_priority_header": True}})
    async with http_on(trusted) as http:
        for headers, body in [({"x-blitz-priority": "high"}, {}),
                              ({}, {"priority": "high"}),
                              ({"x-blitz-priority": "high"}, {"priority": "low"})]:
            r = await http.post("/embed", json={"texts": ["a"], "model": "fake", **body},
                                headers={"authorization": f"Bearer {BULK}", **headers})
            assert r.status_code == 200, r.text
    assert http.levels == [HIGH, NORMAL, HIGH]


class QueueingDispatcher(JobRecordingDispatcher):
    """The review's queue: every job through one ``Batcher`` with priorities, as the
    ingress's queue per (pool, model), ``max_waiting`` texts waiting and one batch in flight;
    the first batch is held until ``gate`` is set."""

    def __init__(self, settings: BlitzSettings, max_waiting: int):
        super().__init__(settings)
        self.gate = asyncio.Event()
        self.batches = 0
        self.batcher: Batcher = Batcher(
            self._run, max_batch=max_waiting, max_waiting=max_waiting,
            size=lambda item: len(item[1].texts), priority=lambda item: priority_of(item[1]),
            promote=lambda item, level: (item[0], with_priority(item[1], level)))

    async def submit(self, pool, model_id, job):
        return await self.batcher.submit((model_id, job))

    async def _run(self, items):
        self.batches += 1
        if self.batches == 1:
            await self.gate.wait()
        return [await JobRecordingDispatcher.submit(self, "cpu", model_id, job)
                for model_id, job in items]

    async def holding(self, waiting: int) -> None:
        """Until the first batch is held and ``waiting`` texts wait behind it."""
        await wait_until_async(lambda: self.batcher.in_flight == 1
                               and self.batcher.waiting == waiting,
                               f"one batch running and {waiting} texts waiting",
                               interval_s=0.001)


@pytest.mark.parametrize(("key", "sheds"), [(OTHER, False), (SEARCH, True)])
async def test_a_self_declared_high_no_longer_sheds_other_clients_queued_work(key, sheds):
    """The review's repro (M5): one batch running, two 4-text normal requests waiting in a
    queue of 8 texts; an 8-text request that says ``high`` with a key granted nothing
    used to shed both (503). Now it runs at normal: it is the one refused, and the queued
    requests are answered. Only a key granted high still makes room that way."""
    settings = BlitzSettings.from_args({**ARGS, "cpu_pool": {"max_batch_size": 8},
                                        "auth": KEYED.auth.model_dump()})
    dispatcher = QueueingDispatcher(settings, max_waiting=8)
    async with api_client(settings, dispatcher) as http:
        def embed(texts: int, key: str, priority: str = "normal"):
            return asyncio.ensure_future(http.post(
                "/embed", json={"texts": ["t"] * texts, "model": "fake"},
                headers={"authorization": f"Bearer {key}", "x-blitz-priority": priority}))

        running = embed(1, BULK)
        await dispatcher.holding(0)
        queued = [embed(4, BULK), embed(4, BULK)]
        await dispatcher.holding(8)
        pushy = embed(8, key, "high")
        await wait_until_async(lambda: pushy.done() or any(q.done() for q in queued),
                               "the 8-text request refused, or the queued ones shed",
                               interval_s=0.001)
        if sheds:
            assert [r.status_code for r in await asyncio.gather(*queued)] == [503, 503]
            dispatcher.gate.set()
            assert [r.status_code for r in await asyncio.gather(running, pushy)] == [200, 200]
            return
        assert not any(q.done() for q in queued)  # nothing shed for it
        refused = await pushy
        assert refused.status_code == 503, refused.text  # the newcomer is refused
        assert refused.headers["retry-after"]
        dispatcher.gate.set()
        replies = await asyncio.gather(running, *queued)
        assert [r.status_code for r in replies] == [200, 200, 200]
        assert dispatcher.levels == [NORMAL] * 3


async def test_every_model_route_takes_a_priority(http):
    routes = [("/v1/embeddings", {"input": ["a"], "model": "fake"}),
              ("/rerank", {"query": "q", "documents": ["a"], "model": "ce"}),
              ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]},
                               "model": "fake"})]
    for path, body in routes:
        r = await http.post(path, json={**body, "priority": "low"})
        assert r.status_code == 200, (path, r.text)
    assert len(http.levels) >= len(routes) and set(http.levels) == {LOW}


@pytest.mark.parametrize(("headers", "body", "param"), [
    ({"x-blitz-priority": "urgent"}, {}, "x-blitz-priority"),
    ({}, {"priority": 2}, "priority"),
    ({"x-blitz-priority": "low"}, {"priority": "bulk"}, "priority"),  # checked all the same
])
async def test_a_bad_priority_is_a_422_naming_where_it_came_from(http, headers, body, param):
    r = await http.post("/embed", json={"texts": ["a"], "model": "fake", **body},
                        headers=headers)
    assert r.status_code == 422
    assert r.json()["error"]["param"] == param
    assert http.levels == []  # refused before any job


async def test_the_python_client_sends_its_priority():
    service, levels, _ = service_and_levels(ANYONE_HIGH)
    transport = api_transport(service)
    async with AsyncClient("http://blitz", transport=transport, priority="low") as bulk:
        await bulk.embed(["a"], model="fake")
        await bulk.embed(["a"], model="fake", priority="high")  # a call's own wins
        await bulk.rerank("q", ["a"], model="ce")
    async with AsyncClient("http://blitz", transport=transport) as plain:
        await plain.embed(["a"], model="fake")
    assert levels == [LOW, HIGH, LOW, NORMAL]


# ---- gRPC ----------------------------------------------------------------------------------

async def test_grpc_metadata_names_the_priority():
    from blitz.grpc_api import tei_pb2 as pb
    from tests.unit.test_grpc_api import call, served

    service, levels, _ = service_and_levels(ANYONE_HIGH)
    tei = tei_servicer(service)
    async with served(tei) as channel:
        embed = call(channel, "Embed")
        await embed(pb.EmbedRequest(inputs="a"), metadata=(("x-blitz-priority", "low"),))
        await embed(pb.EmbedRequest(inputs="a"), metadata=(("priority", "HIGH"),))
        await embed(pb.EmbedRequest(inputs="a"))

        async def two():
            for text in ("a", "b"):
                yield pb.EmbedRequest(inputs=text)

        replies = [r async for r in call(channel, "EmbedStream")(
            two(), metadata=(("x-blitz-priority", "low"),))]
        assert len(replies) == 2
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await embed(pb.EmbedRequest(inputs="a"), metadata=(("priority", "soon"),))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert levels[:3] == [LOW, HIGH, NORMAL] and set(levels[3:]) == {LOW}


async def test_grpc_metadata_is_held_to_the_keys_ceiling_unless_a_gateway_is_trusted():
    from blitz.grpc_api import tei_pb2 as pb
    from tests.unit.test_grpc_api import call, served

    trusted = BlitzSettings.from_args({**ARGS, "auth": {
        **KEYED.auth.model_dump(), "trust_priority_header": True}})
    for settings, expected in ((KEYED, [NORMAL, HIGH, LOW, LOW]),
                               (trusted, [HIGH, HIGH, HIGH, LOW])):
        service, levels, _ = service_and_levels(settings)
        tei = tei_servicer(service)
        async with served(tei) as channel:
            embed = call(channel, "Embed")
            for key, asked in ((OTHER, "high"), (SEARCH, "high"), (BATCH, "high"),
                               (BATCH, None)):
                await embed(pb.EmbedRequest(inputs="a"), metadata=(
                    ("authorization", f"Bearer {key}"),
                    *((("priority", asked),) if asked else ())))
        assert levels == expected


# ---- a pool replica's queue ----------------------------------------------------------------

async def test_a_pool_replica_runs_waiting_high_jobs_before_low_ones():
    settings = BlitzSettings(models=[ModelSpec(id="known", source="fake:8")],
                             cpu_pool={"workers": 1})
    replica = PoolReplica(settings, "cpu")
    gate = asyncio.Event()
    batches: list[list[str]] = []

    async def run_batch(model_id, jobs):
        batches.append([job.texts[0] for job in jobs])
        if len(batches) == 1:
            await gate.wait()
        return [RuntimeError("not run")] * len(jobs)

    replica._run_batch = run_batch  # the model call: recorded, not run
    first = asyncio.ensure_future(replica.run_jobs("known", [EmbedJob(["first"],
                                                                      priority=LOW)]))
    for _ in range(3):
        await asyncio.sleep(0)
    later = [asyncio.ensure_future(replica.run_jobs("known", [EmbedJob([name], priority=p)]))
             for name, p in (("low", LOW), ("normal", NORMAL), ("high", HIGH))]
    for _ in range(3):
        await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *later)
    assert batches == [["first"], ["high"], ["normal"], ["low"]]
