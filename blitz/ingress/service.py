"""The ingress's request logic, free of Ray: limits, routing, chunking, output options.

A ``Dispatcher`` runs jobs on pools; deployments/ implements it with Serve handles, tests
with in-process encoders. Every request is checked against the limits here, before any
model work, and its metrics are recorded here, for HTTP requests and handle calls alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from blitz import timing
from blitz.encoders.base import Encoded
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import (
    InputTooLong,
    InvalidValue,
    ModelLoadFailed,
    PayloadTooLarge,
    as_blitz_error,
)
from blitz.ingress.routing import Route, choose_pool
from blitz.ingress.vector_cache import CachedEmbedder, Computed, Key, fingerprint
from blitz.loading.fetch import read_dimension
from blitz.pool.work import Job
from blitz.schemas import EmbedJob, EmbedResult, RerankHit, RerankJob, RerankResult, Usage
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec, apply_prompt

logger = logging.getLogger("blitz.service")

RouteObserver = Callable[[str, str], None]
"""Receives (pool, reason) once per routing decision; reasons are
``blitz.ingress.routing.REASONS``."""


@dataclass(slots=True)
class RequestRecord:
    """One request's facts for the metrics. The service fills ``model``, ``pool``,
    ``texts`` and ``tokens``; whoever made the record observes it once, with the status
    and the error's ``code`` when it failed: the HTTP middleware for an HTTP request (it
    knows the route and the status), the service for a handle call. Every field that
    becomes a label comes from a closed set (route templates, registry ids, pool names,
    error codes)."""

    route: str
    model: str = ""
    pool: str = ""
    texts: int = 0
    tokens: int = 0
    error: str = ""
    api_key: int = -1  # the index of the API key it came with (-1: none, or keys are off)
    cache_hits: int = 0  # texts answered by the vector cache (ingress.vector_cache_mb)
    cache_misses: int = 0  # texts the cache sent on to a pool
    cache_bytes: int = 0  # what the cache holds after this request
    timings: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    started: float = field(default_factory=time.perf_counter, compare=False, repr=False)


Observer = Callable[[RequestRecord, int, float], None]
"""Receives (record, status, seconds since the record was made) once per request."""


class Dispatcher(Protocol):
    """Runs one job on one pool for one model."""

    pools: frozenset[str]

    def max_batch(self, pool: str) -> int: ...

    def running_pools(self) -> frozenset[str]:
        """The pools with at least one running replica now; cheap enough for every request."""
        ...

    def wake(self, pool: str) -> None:
        """Make ``pool`` start a replica if it has none (returns at once)."""
        ...

    def unplaced_pools(self) -> Mapping[str, str]:
        """Pools with a replica the cluster cannot place, and why (``blitz.ingress.placement``)."""
        ...

    async def embed(self, pool: str, model_id: str, job: EmbedJob) -> Encoded: ...

    async def rerank(self, pool: str, model_id: str, job: RerankJob) -> Encoded: ...

    async def submit(self, pool: str, model_id: str, job: Job) -> Encoded:
        """Any job (``blitz.pool.work.Job``) through the same queue as embed and rerank."""
        ...


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
        self._fingerprints = {spec.id: fingerprint(spec) for spec in self.registry}
        self.default_failed_at: float | None = None  # when the default model last got a 424
        self.not_ready_logged: str | None = None

    # ---- model id --------------------------------------------------------------------

    def spec(self, model_id: str | None) -> ModelSpec:
        """The spec for ``model_id``; the configured default when none is given."""
        default = self.settings.default_model
        assert default is not None  # BlitzSettings' validator fills it in
        return self.registry.get(model_id or default)

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
        record = RequestRecord(route)
        try:
            yield record
        except Exception as exc:
            error = as_blitz_error(exc)
            record.error = error.code
            self.observe(record, error.status)
            raise
        self.observe(record, 200)

    # ---- routing ---------------------------------------------------------------------

    def route(self, kind: str, n_items: int) -> Route:
        """The pool for this request (``blitz.ingress.routing.choose_pool``), observed. A request
        sent away from a cold GPU pool wakes it: Serve scales a pool from zero only when it
        sees demand, and this request is not going to be that demand."""
        route = choose_pool(kind, n_items, self.dispatcher.pools,
                            self.dispatcher.running_pools(), self.settings.routing)
        if route.reason == "cold_gpu":
            self.dispatcher.wake("gpu")
        if self.route_observer is not None:
            self.route_observer(route.pool, route.reason)
        return route

    # ---- limits ----------------------------------------------------------------------

    def check_texts(self, texts: list[str], what: str = "texts") -> None:
        limits = self.settings.limits
        if not texts:
            raise InvalidValue(f"{what} must contain at least one text", param=what)
        if len(texts) > limits.max_texts_per_request:
            raise PayloadTooLarge(
                f"{len(texts)} {what} in one request; the limit max_texts_per_request is "
                f"{limits.max_texts_per_request}", param=what)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidValue(f"{what}[{i}] must be a string", param=what)
            if len(text) > limits.max_chars_per_text:
                raise PayloadTooLarge(
                    f"{what}[{i}] has {len(text)} characters; the limit max_chars_per_text is "
                    f"{limits.max_chars_per_text}", param=what)
            if not text.strip():
                raise InvalidValue(f"{what}[{i}] is empty", param=what)

    # ---- embeddings ------------------------------------------------------------------

    async def embed(self, texts: str | list[str] | None = None, *, model: str | None = None,
                    token_ids: list[list[int]] | None = None, normalize: bool | None = None,
                    truncate: bool = True, dimensions: int | None = None,
                    dtype: OutputDtype = "float32", prompt_name: str | None = None,
                    record: RequestRecord | None = None) -> EmbedResult:
        """Embed ``texts`` (or ``token_ids``) with ``model`` (the default when None).

        ``record`` is the HTTP request's record; without one (a handle call) the call is
        observed here as route ``handle.embed``."""
        with self.recorded(record, "handle.embed") as record:
            record.texts = (len(token_ids) if token_ids is not None else
                            1 if isinstance(texts, str) else len(texts or ()))
            record.model = model or ""  # observed as "other" if it is unknown
            spec = self.spec(model)
            record.model = spec.id
            if spec.kind != "embedding":
                raise InvalidValue(f"model {spec.id!r} is a {spec.kind}; use /rerank for it",
                                   param="model")
            normalize = spec.normalize if normalize is None else normalize
            items: list[str] | None = None
            if token_ids is not None:
                self.check_token_ids(token_ids)
                count = len(token_ids)
            else:
                items = [texts] if isinstance(texts, str) else list(texts or [])
                self.check_texts(items)
                items = apply_prompt(spec, items, prompt_name)
                count = len(items)
            self._check_dimensions(spec, dimensions)

            pool = self.route(spec.kind, count).pool
            compute = self._computer(pool, spec.id, token_ids, normalize, truncate)
            cache_s = None
            if self.vectors is not None and items is not None:
                values, counts, parts, cache_s = await self.vectors.embed(
                    Key(self._fingerprints[spec.id], pool, normalize, truncate, "",
                        record.api_key), items, compute, record)
            else:
                values, counts, parts = await compute(items)
            self._dimensions[spec.id] = int(values.shape[1])  # known now, if it was not
            tokens = int(counts.sum())
            values = quantize(truncate_dimensions(values, dimensions, normalize), dtype)
            record.pool, record.tokens, record.timings = pool, tokens, timing.slowest(parts)
            if cache_s is not None:
                record.timings["cache"] = cache_s
            return EmbedResult(values, spec.id, Usage.of(tokens), pool)

    def _computer(self, pool: str, model_id: str, token_ids: list[list[int]] | None,
                  normalize: bool, truncate: bool,
                  ) -> Callable[[list[str] | None], Awaitable[Computed]]:
        """``compute(texts)``: the rows, token counts and parts of ``texts`` (or of
        ``token_ids`` when texts is None) from ``pool``, in chunks of its batch limit."""
        size = self.dispatcher.max_batch(pool)

        async def compute(texts: list[str] | None) -> Computed:
            count = len(texts) if texts is not None else len(token_ids or ())
            jobs = [EmbedJob(texts=texts[i:i + size] if texts is not None else None,
                             token_ids=token_ids[i:i + size] if token_ids is not None else None,
                             normalize=normalize, truncate=truncate)
                    for i in range(0, count, size)]
            parts = await self.gather(
                [self.dispatcher.embed(pool, model_id, job) for job in jobs], size)
            if len(parts) == 1:
                return parts[0].values, parts[0].token_counts, parts
            return (np.concatenate([p.values for p in parts]),
                    np.concatenate([p.token_counts for p in parts]), parts)

        return compute

    def check_token_ids(self, token_ids: list[list[int]], what: str = "input") -> None:
        limits = self.settings.limits
        if not token_ids or any(len(row) == 0 for row in token_ids):
            raise InvalidValue(f"{what} must contain at least one token id per item",
                               param=what)
        if len(token_ids) > limits.max_texts_per_request:
            raise PayloadTooLarge(
                f"{len(token_ids)} inputs in one request; the limit max_texts_per_request is "
                f"{limits.max_texts_per_request}", param=what)
        total = 0
        for i, row in enumerate(token_ids):
            if len(row) > limits.max_chars_per_text:
                raise PayloadTooLarge(
                    f"{what}[{i}] has {len(row)} token ids; the limit max_chars_per_text is "
                    f"{limits.max_chars_per_text}", param=what)
            total += len(row)
        if total > limits.max_token_ids_per_request:
            raise PayloadTooLarge(
                f"{total} token ids in one request; the limit max_token_ids_per_request is "
                f"{limits.max_token_ids_per_request}", param=what)

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

    # ---- rerank ----------------------------------------------------------------------

    async def rerank(self, query: str, documents: list[str], *, model: str | None = None,
                     top_n: int | None = None, return_documents: bool = False,
                     truncate: bool = True, record: RequestRecord | None = None) -> RerankResult:
        """Score ``documents`` against ``query``, best first; ``record`` as for ``embed``."""
        with self.recorded(record, "handle.rerank") as record:
            record.texts = len(documents or ())
            record.model = model or ""  # observed as "other" if it is unknown
            spec = self.spec(model)
            record.model = spec.id
            limits = self.settings.limits
            if not isinstance(query, str) or not query.strip():
                raise InvalidValue("query must be a non-empty string", param="query")
            if len(query) > limits.max_chars_per_text:
                raise PayloadTooLarge(f"query has {len(query)} characters; the limit "
                                      f"max_chars_per_text is {limits.max_chars_per_text}",
                                      param="query")
            self.check_texts(documents, "documents")
            if top_n is not None:
                if top_n < 1:
                    raise InvalidValue("top_n must be at least 1", param="top_n")
                if top_n > limits.max_top_n:
                    raise PayloadTooLarge(f"top_n={top_n}; the limit max_top_n is "
                                          f"{limits.max_top_n}", param="top_n")

            pool = self.route(spec.kind, len(documents)).pool
            size = self.dispatcher.max_batch(pool)
            jobs = [RerankJob(query, documents[i:i + size], truncate)
                    for i in range(0, len(documents), size)]
            parts = await self.gather(
                [self.dispatcher.rerank(pool, spec.id, job) for job in jobs], size)
            scores = np.concatenate([p.values for p in parts])
            tokens = int(sum(int(p.token_counts.sum()) for p in parts))
            order = np.argsort(-scores, kind="stable")[: top_n or len(documents)]
            hits = [RerankHit(int(i), float(scores[i]),
                              documents[i] if return_documents else None) for i in order]
            record.pool, record.tokens, record.timings = pool, tokens, timing.slowest(parts)
            return RerankResult(hits, spec.id, Usage.of(tokens), pool)
