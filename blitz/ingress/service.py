"""The ingress's request logic, free of Ray: the request pipeline, routing, output options.

A ``Dispatcher`` runs jobs on pools; deployments/ implements it with Serve handles, tests
with in-process encoders. Every request that runs a model goes through one pipeline
(``EmbeddingService.run``): its model resolved, its inputs checked against the limits
(``blitz.ingress.limits``) before any model work, routed, sent in jobs of the pool's batch
limit; its metrics are recorded here, for HTTP requests and handle calls alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from blitz import timing
from blitz.encoders.base import Encoded, stacked
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import (
    BlitzError,
    InputTooLong,
    InvalidValue,
    ModelLoadFailed,
    as_blitz_error,
)
from blitz.hop_messages import (
    NORMAL,
    EmbedJob,
    EmbedOptions,
    EmbedResult,
    RerankHit,
    RerankJob,
    RerankResult,
    Usage,
    with_priority,
)
from blitz.ingress.limits import (
    check_prompted,
    check_rerank,
    check_texts,
    check_token_ids,
    weighed,
)
from blitz.ingress.long_inputs import WindowCounter, check_long_inputs, chunked, text_chunks
from blitz.ingress.routing import Route, choose_pool
from blitz.ingress.tokenizers import Tokenizers, model_folder
from blitz.ingress.vector_cache import CachedEmbedder
from blitz.loading.facts import read_dimension
from blitz.pool.mixed_batch import Job
from blitz.runtime.tracing import RequestSpan
from blitz.settings.config import BlitzSettings
from blitz.settings.kinds import KINDS, Service
from blitz.settings.registry import ModelSpec, apply_prompt

logger = logging.getLogger("blitz.service")

RouteObserver = Callable[[str, str], None]
"""Receives (pool, reason) once per routing decision (``blitz.ingress.routing.REASONS``)."""


@dataclass(slots=True)
class RequestRecord:
    """One request's facts for the metrics. The service fills ``model``, ``pool``, ``texts``
    and ``tokens``; whoever made the record observes it once, with the status and the
    error's ``code`` when it failed: the HTTP middleware for an HTTP request, the service
    for a handle call. Labels come from closed sets (routes, model ids, pools, codes)."""

    route: str
    model: str = ""
    pool: str = ""
    texts: int = 0
    images: int = 0  # images embedded (a dual encoder's; ``texts`` counts its texts)
    tokens: int = 0
    error: str = ""
    api_key: int = -1  # the index of the API key it came with (-1: none, or keys are off)
    cache_hits: int = 0  # texts answered by the vector cache (ingress.vector_cache_mb)
    cache_misses: int = 0  # texts the cache sent on to a pool
    cache_bytes: int = 0  # what the cache holds after this request
    priority: int = NORMAL  # its level (blitz.hop_messages.PRIORITIES); every job carries it
    trace: RequestSpan | None = field(default=None, compare=False, repr=False)  # when traced
    timings: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    started: float = field(default_factory=time.perf_counter, compare=False, repr=False)


Observer = Callable[[RequestRecord, int, float], None]
"""Receives (record, status, seconds since the record was made) once per request."""


def record_failure(record: RequestRecord, exc: BaseException,
                   observe: Callable[[RequestRecord, int], None]) -> BlitzError:
    """The one way a failed request is counted: ``exc``'s error code into ``record``, then
    ``observe(record, its status)``. Returns the error answered for ``exc``."""
    error = as_blitz_error(exc)
    record.error = error.code
    observe(record, error.status)
    return error


class Dispatcher(Protocol):
    """Runs one job on one pool for one model."""

    pools: frozenset[str]

    def max_batch(self, pool: str) -> int: ...
    # the pools with a running replica now (cheap enough for every request)
    def running_pools(self) -> frozenset[str]: ...
    def wake(self, pool: str) -> None: ...  # make ``pool`` start a replica (returns at once)
    # pools with a replica the cluster cannot place, and why (blitz.ingress.placement)
    def unplaced_pools(self) -> Mapping[str, str]: ...

    async def submit(self, pool: str, model_id: str, job: Job) -> Encoded:
        """``job`` (any ``blitz.pool.mixed_batch.Job``) for ``model_id`` on ``pool``, through the
        one queue of that pool and model; what the pool raised is raised here."""
        ...


Send = Callable[[list[Any]], Awaitable[list[Encoded]]]
"""Sends some of a request's items to its pool, in jobs of the pool's batch limit; their
parts, one per job."""
Split = Callable[[list[Any], int], list[list[Any]]]  # items in jobs, given the batch limit
Cost = Callable[[ModelSpec, list[Any]], Awaitable[list[int] | None]]
"""Each item's units (a chunked text's windows), counted before any work; None: one each."""
Through = Callable[[ModelSpec, str, list[Any], Send], Awaitable[list[Encoded]]]
"""Stands between a request's items and its pool (the vector cache): given the spec, the
pool, the items and ``Send``, parts that answer all of the items."""


class Ran(NamedTuple):
    """What the pipeline (``EmbeddingService.run``) gives back."""

    spec: ModelSpec
    pool: str
    parts: list[Encoded]  # one per job, in the items' order


class EmbeddingService:
    def __init__(self, settings: BlitzSettings, dispatcher: Dispatcher,
                 observer: Observer | None = None, route_observer: RouteObserver | None = None):
        self.settings = settings
        self.registry = settings.registry()
        self.dispatcher = dispatcher
        self.observer = observer
        self.route_observer = route_observer
        self.started = int(time.time())
        self._dimensions: dict[str, int | None] = {}
        cache_mb = settings.ingress.vector_cache_mb
        self.vectors = CachedEmbedder(int(cache_mb * 2**20)) if cache_mb > 0 else None
        self.default_failed_at: float | None = None  # when the default model last got a 424
        # the models' tokenizers on the ingress: /tokenize, and what a request costs
        self.tokenizers = Tokenizers(lambda model_id: model_folder(self.spec(model_id),
                                                                   settings.cache_dir))
        self.windows = WindowCounter(self.tokenizers.checked)
        self.not_ready_logged: str | None = None

    # ---- model id --------------------------------------------------------------------

    def spec(self, model_id: str | None) -> ModelSpec:
        """The spec for ``model_id``; the configured default when none is given."""
        default = self.settings.default_model
        assert default is not None  # BlitzSettings' validator fills it in
        return self.registry.get(model_id or default)

    def forget(self, model_id: str) -> None:
        """Drop what is known of ``model_id`` (the admin API changed or removed it)."""
        self._dimensions.pop(model_id, None)
        if self.vectors is not None:
            self.vectors.forget(model_id)
        self.tokenizers.forget(model_id)
        self.windows.forget(model_id)

    # ---- metrics ---------------------------------------------------------------------

    def observe(self, record: RequestRecord, status: int) -> None:
        """Hand one finished request to the observer; an unknown model id is "other"."""
        if record.model == self.settings.default_model:  # what /ready knows of it
            if record.error == ModelLoadFailed.code:
                self.default_failed_at = time.monotonic()
            elif status == 200:
                self.default_failed_at = None
        if self.observer is None:
            return
        if record.model and record.model not in self.registry:
            record.model = "other"
        self.observer(record, status, time.perf_counter() - record.started)

    @contextmanager
    def recorded(self, record: RequestRecord | None, route: str) -> Iterator[RequestRecord]:
        """The caller's record, or for a handle call a new one, observed here on exit."""
        if record is not None:
            yield record
            return
        with self.observed(RequestRecord(route)) as record:
            yield record

    @contextmanager
    def observed(self, record: RequestRecord) -> Iterator[RequestRecord]:
        """``record``, observed on exit: 200, or its error's status (a handle call's; the
        handle API makes one itself when the caller gives a priority)."""
        try:
            yield record
        except Exception as exc:
            record_failure(record, exc, self.observe)
            raise
        self.observe(record, 200)

    # ---- the pipeline ----------------------------------------------------------------

    async def run(self, record: RequestRecord, model: str | None,
                  inputs: Callable[[ModelSpec], list[Any]],
                  make_job: Callable[[ModelSpec, list[Any]], Job], *,
                  serves: Service | None = None, other_kind: str = "",
                  through: Through | None = None, split: Split | None = None,
                  cost: Cost | None = None) -> Ran:
        """The ingress request pipeline, one for every route that runs a model: resolve
        ``model`` (None: the default) into ``record``; refuse a model whose kind does not
        serve ``serves`` (``blitz.settings.kinds``; None: any), the error saying
        ``other_kind``; take ``inputs(spec)``, the
        request's items, checked, and their ``cost`` (units each, before any work: a chunked
        text's windows); route them; send them in ``make_job(spec, chunk)`` jobs of the
        pool's batch limit in units (images: ``split``'s, routed as images), in parallel
        (through ``through`` when given), traced; fill the record's pool, tokens and timings.
        The caller sets ``record.texts``."""
        record.model = model or ""  # observed as "other" if it is unknown
        spec = self.spec(model)
        record.model = spec.id
        if serves is not None and serves not in KINDS[spec.kind].serves:  # kind_of, inline
            raise InvalidValue(f"model {spec.id!r} is a {spec.kind}; {other_kind}",
                               param="model")
        items = inputs(spec)
        units = await cost(spec, items) if cost is not None else None
        pool = self.route(spec.kind, sum(units) if units else len(items),
                          images=split is not None).pool
        size = self.dispatcher.max_batch(pool)
        if record.trace is not None:  # traced: its jobs carry its span's context to the pool
            make_job = record.trace.stamping(make_job)
        if units is not None:  # jobs of at most ``size`` units, each carrying its units
            split, make_job = weighed(dict(zip(items, units, strict=True)), make_job)

        async def send(some: list[Any]) -> list[Encoded]:
            return await self.gather([self.dispatcher.submit(pool, spec.id, with_priority(
                make_job(spec, part), record.priority)) for part in (split(some, size) if split else [
                    some[i:i + size] for i in range(0, len(some), size)])], size)

        parts = await (send(items) if through is None else through(spec, pool, items, send))
        record.pool, record.timings = pool, timing.slowest(parts)
        record.tokens = int(sum(int(p.token_counts.sum()) for p in parts))
        return Ran(spec, pool, parts)

    def route(self, kind: str, n_items: int, images: bool = False) -> Route:
        """The pool for this request (``blitz.ingress.routing.choose_pool``), observed. A request
        sent away from a cold GPU pool wakes it: Serve scales a pool from zero only when it
        sees demand, and this request is not going to be that demand."""
        route = choose_pool(kind, n_items, self.dispatcher.pools,
                            self.dispatcher.running_pools(), self.settings.routing, images)
        if route.reason == "cold_gpu":
            self.dispatcher.wake("gpu")
        if self.route_observer is not None:
            self.route_observer(route.pool, route.reason)
        return route

    @staticmethod
    async def gather(calls: list, chunk_size: int) -> list[Encoded]:
        """Run chunk calls in parallel; an over-long input is reported at its request index.
        One call (most requests) is awaited in the request's own task: no task of its own,
        one loop step less."""
        outcomes: list[Any]
        if len(calls) == 1:
            try:
                outcomes = [await calls[0]]
            except Exception as exc:  # as gather's return_exceptions; a cancellation propagates
                outcomes = [exc]
        else:
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        parts: list[Encoded] = []
        for k, res in enumerate(outcomes):
            if isinstance(res, BaseException):
                error = as_blitz_error(res)  # what a pool replica raised arrives wrapped
                if isinstance(error, InputTooLong):
                    raise error.shifted(k * chunk_size)
                raise res
            parts.append(res)
        return parts

    # ---- embeddings ------------------------------------------------------------------

    async def embed(self, texts: str | list[str] | None = None, model: str | None = None, *,
                    token_ids: list[list[int]] | None = None, normalize: bool | None = None,
                    truncate: bool = True, dimensions: int | None = None,
                    dtype: OutputDtype = "float32", prompt_name: str | None = None,
                    instruction: str | None = None, truncation_side: str | None = None,
                    long_inputs: str | None = None, return_chunks: bool = False,
                    record: RequestRecord | None = None) -> EmbedResult:
        """Embed ``texts`` (or ``token_ids``) with ``model`` (the default when None),
        behind the model's prompt ``prompt_name`` or a free-form ``instruction``.
        ``long_inputs`` (truncate | error | chunk; None: the model's) says what becomes of
        an over-long text; ``return_chunks`` chunks it and gives each window too.

        ``record`` is the HTTP request's record; without one (a handle call) the call is
        observed here as route ``handle.embed``."""
        return await self.embed_with(texts, model, EmbedOptions(
            normalize=normalize, truncate=truncate, truncation_side=truncation_side,
            long_inputs=long_inputs, return_chunks=return_chunks, dimensions=dimensions,
            dtype=dtype, prompt_name=prompt_name, instruction=instruction),
            token_ids=token_ids, record=record)

    async def embed_with(self, texts: str | list[str] | None, model: str | None,
                         options: EmbedOptions, *, token_ids: list[list[int]] | None = None,
                         record: RequestRecord | None = None) -> EmbedResult:
        """``embed``, its options one value (as the HTTP and gRPC routes build them)."""
        o = options
        with self.recorded(record, "handle.embed") as record:
            record.texts = (len(token_ids) if token_ids is not None else
                            1 if isinstance(texts, str) else len(texts or ()))
            limits = self.settings.limits
            prefix = 0  # the prompt's characters before each text
            chunks = False  # whether the texts are cut into windows (counted: ``cost``)

            def inputs(spec: ModelSpec) -> list[Any]:
                nonlocal prefix, chunks
                check_long_inputs(o.long_inputs, o.return_chunks, token_ids=token_ids is not None)
                self._check_dimensions(spec, o.dimensions)
                if token_ids is not None:
                    check_token_ids(token_ids, limits)
                    return token_ids
                given = [texts] if isinstance(texts, str) else list(texts or [])
                check_texts(given, limits)
                chunks = chunked(spec, o.long_inputs, o.return_chunks)
                if o.prompt_name is None and o.instruction is None:
                    return given
                prefix = len(apply_prompt(spec, [""], o.prompt_name, o.instruction)[0])
                check_prompted(given, prefix, limits, instruction=o.instruction)
                return apply_prompt(spec, given, o.prompt_name, o.instruction)

            async def cost(spec: ModelSpec, items: list[Any]) -> list[int] | None:
                return await self.windows.units(spec, items, limits) if chunks else None

            def job(spec: ModelSpec, chunk: list[Any]) -> EmbedJob:
                if token_ids is not None:
                    return EmbedJob(token_ids=chunk, normalize=o.normalized(spec.normalize),
                                    truncate=o.truncate and o.long_inputs != "error")
                return o.job(chunk, spec.normalize)

            cached = (self.vectors.through(record, o)
                      if self.vectors is not None and token_ids is None and not o.return_chunks
                      else None)
            spec, pool, parts = await self.run(record, model, inputs, job, serves="embed",
                                               other_kind="use /rerank for it", through=cached,
                                               cost=cost)
            values = stacked(parts)
            self._dimensions[spec.id] = int(values.shape[1])  # known now, if it was not
            normalized = o.normalized(spec.normalize)
            values = quantize(truncate_dimensions(values, o.dimensions, normalized), o.dtype)
            return EmbedResult(values, spec.id, Usage.of(record.tokens), pool, text_chunks(
                parts, prefix, o.dimensions, normalized, o.dtype) if o.return_chunks else None)

    def dimension_of(self, spec: ModelSpec) -> int | None:
        """``spec``'s vector size (a sparse model's: its vocabulary), once known: from the
        files, or for a model whose files are remote, its first reply."""
        known = self._dimensions.get(spec.id)
        if known is None:
            known = self._dimensions[spec.id] = read_dimension(spec)
        return known

    def _check_dimensions(self, spec: ModelSpec, dimensions: int | None) -> None:
        if dimensions is None:
            return
        if dimensions < 1:  # HTTP's bodies refuse it first, in these words (gt=0); gRPC's
            raise InvalidValue("dimensions: Input should be greater than 0",  # proto3 sends 0
                               param="dimensions")
        known = self.dimension_of(spec)
        if known is not None and dimensions > known:
            raise InvalidValue(
                f"dimensions={dimensions} is larger than model {spec.id!r}'s dimension {known}",
                param="dimensions")

    # ---- rerank ----------------------------------------------------------------------

    async def rerank(self, query: str, documents: list[str], model: str | None = None, *,
                     top_n: int | None = None, return_documents: bool = False,
                     truncate: bool = True, record: RequestRecord | None = None) -> RerankResult:
        """Score ``documents`` against ``query``, best first; ``record`` as for ``embed``."""
        with self.recorded(record, "handle.rerank") as record:
            record.texts = len(documents or ())
            limits = self.settings.limits
            spec, pool, parts = await self.run(
                record, model, lambda _: check_rerank(query, documents, top_n, limits),
                lambda _, chunk: RerankJob(query, chunk, truncate))
            scores = np.concatenate([p.values for p in parts])
            order = np.argsort(-scores, kind="stable")[: top_n or len(documents)]
            hits = [RerankHit(int(i), float(scores[i]),
                              documents[i] if return_documents else None) for i in order]
            return RerankResult(hits, spec.id, Usage.of(record.tokens), pool)
