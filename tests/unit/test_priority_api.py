"""A request's priority from every entry point to the jobs it sends (no Ray): HTTP's
``x-blitz-priority`` header and body ``priority`` (the header wins), the handle API's
``priority=``, gRPC metadata, the Python client; jobs carry it across the hop, and a pool
replica's queue runs high before low."""

from __future__ import annotations

import asyncio
import pickle

import grpc
import httpx
import pytest

from blitz.client import AsyncClient
from blitz.errors import InvalidValue
from blitz.hop_messages import (
    HIGH,
    LOW,
    NORMAL,
    ClassifyJob,
    EmbedJob,
    RerankJob,
    priority_level,
    priority_of,
    with_priority,
)
from blitz.http.api import HttpApi
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.pool.replica import PoolReplica
from blitz.runtime.draining import Drain
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from deployments.ingress import Ingress
from tests.local_dispatcher import LocalDispatcher

SETTINGS = BlitzSettings.from_args({
    "models": [{"id": "fake", "source": "fake:16"},
               {"id": "ce", "source": "fake:4", "kind": "cross-encoder"}],
    "cpu_pool": {"max_batch_size": 2}})


class JobRecordingDispatcher(LocalDispatcher):
    """Runs every job on the local encoders and keeps each job's priority level."""

    def __init__(self, settings=SETTINGS):
        super().__init__(settings)
        self.levels: list[int] = []

    async def submit(self, pool, model_id, job):
        self.levels.append(job.priority)
        return await super().submit(pool, model_id, job)


def service_and_levels() -> tuple[EmbeddingService, list[int], list[RequestRecord]]:
    dispatcher = JobRecordingDispatcher()
    observed: list[RequestRecord] = []
    service = EmbeddingService(SETTINGS, dispatcher,
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

@pytest.fixture
async def http():
    service, levels, _ = service_and_levels()
    transport = httpx.ASGITransport(HttpApi(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://blitz") as client:
        client.levels = levels  # type: ignore[attr-defined]
        yield client


@pytest.mark.parametrize(("headers", "body", "level"), [
    ({}, {}, NORMAL),
    ({}, {"priority": "low"}, LOW),
    ({"x-blitz-priority": "high"}, {}, HIGH),
    ({"x-blitz-priority": "High"}, {"priority": "low"}, HIGH),  # the header wins
])
async def test_http_takes_the_header_else_the_body(http, headers, body, level):
    r = await http.post("/embed", json={"texts": ["a"], "model": "fake", **body},
                        headers=headers)
    assert r.status_code == 200, r.text
    assert http.levels == [level]


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
    service, levels, _ = service_and_levels()
    transport = httpx.ASGITransport(HttpApi(service))
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
    from blitz.grpc_api.servicer import TeiServicer
    from blitz.ingress.other_outputs import OutputService
    from blitz.ingress.tokenizing import TokenService
    from tests.unit.test_grpc_api import call, served

    service, levels, _ = service_and_levels()
    tei = TeiServicer(service, TokenService(service), OutputService(service))
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
