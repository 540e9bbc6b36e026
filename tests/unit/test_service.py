"""EmbeddingService and the ingress's handle API on fake encoders, no Ray: each request is
observed once (handle calls by the service, HTTP requests by the middleware), the handle
methods take the native API's options by name, and errors a pool raised keep their index."""

from __future__ import annotations

import pytest
from ray.exceptions import RayTaskError

from blitz.errors import InputTooLong, Overloaded, UnknownModel
from blitz.hop_messages import RerankJob
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.runtime.draining import Drain
from blitz.settings.config import BlitzSettings
from deployments.ingress import Ingress

SETTINGS = BlitzSettings.from_args({
    "models": [{"id": "fake", "source": "fake:16", "max_seq_length": 8},
               {"id": "fake8", "source": "fake:8"}],
    "cpu_pool": {"max_batch_size": 2}})


def observed_service(dispatcher=None) -> tuple[EmbeddingService, list[tuple]]:
    """A service whose observer keeps (route, model, pool, status, texts) per request."""
    observed: list[tuple] = []

    def observer(record: RequestRecord, status: int, seconds: float) -> None:
        assert seconds >= 0
        observed.append((record.route, record.model, record.pool, status, record.texts))

    service = EmbeddingService(SETTINGS, dispatcher or ReplicaDispatcher(SETTINGS),
                               observer=observer)
    return service, observed


class IngressMethods:
    """The ingress deployment's handle methods on ``service``, without a replica."""

    embed = Ingress.func_or_class.embed
    rerank = Ingress.func_or_class.rerank

    def __init__(self, service: EmbeddingService):
        self.service = service
        self.drain = Drain()  # the replica's stop (blitz.runtime.draining)


async def test_handle_calls_are_observed_once_each_with_their_outcome():
    service, observed = observed_service()
    await service.embed(["a", "b", "c"], model="fake8")
    await service.rerank("q", ["a", "b"])
    with pytest.raises(UnknownModel):
        await service.embed("a", model="nope")
    assert observed == [("handle.embed", "fake8", "cpu", 200, 3),
                        ("handle.rerank", "fake", "cpu", 200, 2),
                        ("handle.embed", "other", "", 404, 1)]


async def test_a_callers_record_is_filled_not_observed():
    service, observed = observed_service()
    record = RequestRecord("/v1/embeddings")
    result = await service.embed(token_ids=[[1, 2], [3]], record=record)
    assert record == RequestRecord("/v1/embeddings", "fake", "cpu", texts=2,
                                   tokens=result.usage.prompt_tokens)
    assert observed == []  # its maker (the HTTP middleware) observes it


async def test_ingress_handle_methods_take_the_native_options_by_name():
    service, observed = observed_service()
    replica = IngressMethods(service)
    result = await replica.embed(["a"], "fake", dimensions=4, dtype="float16",
                                 normalize=False, truncate=True)
    assert result.embeddings.shape == (1, 4) and str(result.embeddings.dtype) == "float16"
    ranked = await replica.rerank("q", ["a", "b", "c"], model="fake", top_n=1,
                                  return_documents=True)
    assert len(ranked.results) == 1 and ranked.results[0].document in {"a", "b", "c"}
    assert [labels[0] for labels in observed] == ["handle.embed", "handle.rerank"]


async def test_a_misspelt_handle_option_is_a_type_error():
    service, observed = observed_service()
    replica = IngressMethods(service)
    with pytest.raises(TypeError, match="normalise"):
        await replica.embed(["a"], model="fake", normalise=False)
    with pytest.raises(TypeError, match="top_k"):
        await replica.rerank("q", ["a"], top_k=1)
    with pytest.raises(TypeError, match="record"):  # the service's own, not the caller's
        await replica.embed(["a"], model="fake", record=None)
    assert observed == []


def test_every_handle_method_has_its_service_methods_signature_but_the_record():
    import inspect

    from deployments.handle_methods import HANDLE_METHODS

    for name, (_holder, function) in HANDLE_METHODS.items():
        mine = inspect.signature(getattr(Ingress.func_or_class, name))
        theirs = [p.replace(name="priority", default=None, annotation="str | None")
                  if p.name == "record" else p
                  for p in inspect.signature(function).parameters.values()]
        assert list(mine.parameters.values()) == theirs, name


class WrappingDispatcher(ReplicaDispatcher):
    """Answers the second rerank chunk with an over-long input, wrapped as Ray wraps what a
    replica raised."""

    async def submit(self, pool, model_id, job):
        if isinstance(job, RerankJob) and job.documents[0] == "long":
            raise RayTaskError("run_jobs", "tb", InputTooLong.at(0, 999, 8))
        return await super().submit(pool, model_id, job)


async def test_an_over_long_input_a_pool_raised_is_reported_at_its_request_index():
    service, observed = observed_service(WrappingDispatcher(SETTINGS))
    with pytest.raises(InputTooLong) as info:  # batches of 2: "long" opens the second
        await service.rerank("q", ["a", "b", "long", "c"], model="fake")
    assert info.value.index == 2
    assert observed == [("handle.rerank", "fake", "", 413, 4)]


class ColdGpuDispatcher(ReplicaDispatcher):
    """Both pools exist; the GPU pool has a running replica only once ``warm`` is set.
    Records the pool each job was sent to and every wake."""

    def __init__(self, settings):
        super().__init__(settings, pools=frozenset({"cpu", "gpu"}))
        self.warm = False
        self.asked: list[str] = []
        self.woken: list[str] = []

    def running_pools(self):
        return self.pools if self.warm else frozenset({"cpu"})

    def wake(self, pool):
        self.woken.append(pool)

    async def submit(self, pool, model_id, job):
        self.asked.append(pool)
        return await super().submit(pool, model_id, job)


async def test_a_cold_gpu_pool_is_woken_while_its_requests_are_served_on_the_cpu_pool():
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:8"},
                   {"id": "fake-ce", "source": "fake:8", "kind": "cross-encoder"}],
        "routing": {"gpu_min_batch": 4}})
    dispatcher = ColdGpuDispatcher(settings)
    routes: list[tuple[str, str]] = []
    service = EmbeddingService(settings, dispatcher,
                               route_observer=lambda *labels: routes.append(labels))

    small = await service.embed(["a", "b"])
    large = await service.embed(["a", "b", "c", "d", "e"])
    ranked = await service.rerank("q", ["a"], model="fake-ce")
    assert (small.pool, large.pool, ranked.pool) == ("cpu", "cpu", "cpu")
    assert dispatcher.asked == ["cpu", "cpu", "cpu"]
    assert routes == [("cpu", "small"), ("cpu", "cold_gpu"), ("cpu", "cold_gpu")]
    assert dispatcher.woken == ["gpu", "gpu"]  # only the requests sent away wake it

    dispatcher.warm = True  # a GPU replica is up
    large = await service.embed(["a", "b", "c", "d", "e"])
    ranked = await service.rerank("q", ["a"], model="fake-ce")
    assert (large.pool, ranked.pool) == ("gpu", "gpu")
    assert dispatcher.asked[3:] == ["gpu", "gpu"]
    assert routes[3:] == [("gpu", "size"), ("gpu", "kind")]
    assert dispatcher.woken == ["gpu", "gpu"]


async def test_with_cold_gpu_wait_requests_queue_for_the_gpu_pool_and_wake_nothing():
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:8"}],
        "routing": {"gpu_min_batch": 4, "cold_gpu": "wait"}})
    dispatcher = ColdGpuDispatcher(settings)
    result = await EmbeddingService(settings, dispatcher).embed(["a", "b", "c", "d"])
    assert result.pool == "gpu" and dispatcher.asked == ["gpu"]
    assert dispatcher.woken == []  # the request itself is the demand Serve scales on


class OverloadedDispatcher(ReplicaDispatcher):
    async def submit(self, pool, model_id, job):
        raise RayTaskError("run_jobs", "tb", Overloaded("the cpu pool is at capacity"))


async def test_the_observer_gets_tokens_latency_and_the_error_code():
    records: list[tuple[RequestRecord, int, float]] = []
    service = EmbeddingService(SETTINGS, ReplicaDispatcher(SETTINGS),
                               observer=lambda *args: records.append(args))
    result = await service.embed(["a b c", "d"], model="fake8")
    await service.rerank("q", ["a", "b"], model="fake")
    service.dispatcher = OverloadedDispatcher(SETTINGS)
    with pytest.raises(RayTaskError):
        await service.embed(["a"], model="fake")
    (embed, s1, t1), (rerank, s2, _), (refused, s3, t3) = records
    assert (embed.tokens, embed.error, s1) == (result.usage.prompt_tokens, "", 200)
    assert rerank.tokens > 0 and rerank.error == "" and s2 == 200
    assert (refused.error, refused.tokens, refused.pool, s3) == ("overloaded", 0, "", 503)
    assert 0 <= t1 and 0 <= t3
