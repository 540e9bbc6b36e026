"""The ingress: HTTP requests and Ray handle calls in, pool calls out."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from blitz.batching import Coalescer
from blitz.config import BlitzSettings
from blitz.encoders.base import Encoded
from blitz.errors import Overloaded
from blitz.http_api import HttpApi
from blitz.schemas import EmbedJob, EmbedResult, RerankJob, RerankResult
from blitz.service import EmbeddingService
from deployments.metrics import metrics

# pool calls in flight per (model, options) before requests wait to be merged: two keep
# the pool busy (one computing, one queued) while the ingress gathers the next
COALESCED_CALLS_IN_FLIGHT = 2


class ServeDispatcher:
    """Runs jobs on pool replicas, passing the model id on every hop."""

    def __init__(self, settings: BlitzSettings, handles: dict[str, DeploymentHandle]):
        self.settings = settings
        self.handles = handles
        self.pools = frozenset(handles)
        self._lanes: dict[tuple, Coalescer] = {}

    def max_batch(self, pool: str) -> int:
        return (self.settings.gpu_pool if pool == "gpu" else self.settings.cpu_pool).max_batch_size

    async def _call(self, pool: str, model_id: str, method: str, job: Any) -> Encoded:
        handle = self.handles[pool].options(multiplexed_model_id=model_id)
        try:
            return await getattr(handle, method).remote(job)
        except BackPressureError as exc:
            raise Overloaded(f"the {pool} pool is at capacity; retry shortly") from exc
        except RayTaskError as exc:  # re-raise what the replica raised
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    async def embed(self, pool: str, model_id: str, job: EmbedJob) -> Encoded:
        if pool != "cpu" or job.texts is None or len(job) >= self.max_batch(pool):
            return await self._call(pool, model_id, "embed", job)
        key = (pool, model_id, job.normalize, job.truncate)
        lane = self._lanes.get(key)
        if lane is None:  # concurrent small requests alike become one pool call
            lane = self._lanes[key] = Coalescer(
                partial(self._embed_merged, pool, model_id), max_size=self.max_batch(pool),
                size=len, max_in_flight=COALESCED_CALLS_IN_FLIGHT)
        return await lane.submit(job)

    async def _embed_merged(self, pool: str, model_id: str,
                            jobs: list[EmbedJob]) -> list[Encoded | BaseException]:
        if len(jobs) == 1:
            return [await self._call(pool, model_id, "embed", jobs[0])]
        merged_job = EmbedJob(texts=[t for job in jobs for t in job.texts],
                              normalize=jobs[0].normalize, truncate=jobs[0].truncate)
        try:
            merged = await self._call(pool, model_id, "embed", merged_job)
        except Exception:  # one request's bad input must not fail the others
            return await asyncio.gather(
                *(self._call(pool, model_id, "embed", job) for job in jobs),
                return_exceptions=True)
        results, start = [], 0
        for job in jobs:
            n = len(job)
            results.append(Encoded(merged.values[start:start + n],
                                   merged.token_counts[start:start + n],
                                   merged.padded_tokens * n // max(len(merged.values), 1)))
            start += n
        return results

    async def rerank(self, pool: str, model_id: str, job: RerankJob) -> Encoded:
        return await self._call(pool, model_id, "rerank", job)


def route_library_logs_to_serve() -> None:
    """Send the ``blitz`` loggers' records (tracebacks with request ids) to the replica log."""
    library = logging.getLogger("blitz")
    if not library.handlers:
        for handler in logging.getLogger("ray.serve").handlers:
            library.addHandler(handler)
        library.setLevel(logging.INFO)
        library.propagate = False


@serve.deployment
class Ingress:
    def __init__(self, settings: dict[str, Any], cpu_pool: DeploymentHandle,
                 gpu_pool: DeploymentHandle | None = None):
        self.settings = BlitzSettings.from_args(settings)
        handles = {"cpu": cpu_pool} | ({"gpu": gpu_pool} if gpu_pool is not None else {})
        self.service = EmbeddingService(self.settings, ServeDispatcher(self.settings, handles))
        self.api = HttpApi(self.service, observe=metrics.observe_request)
        route_library_logs_to_serve()

    async def __call__(self, request: Request) -> Response:
        return await self.api(request)

    async def embed(self, texts: str | list[str], model: str | None = None,
                    **options: Any) -> EmbedResult:
        """Handle API: ``await handle.embed.remote(texts, model="minilm")``."""
        return await self.service.embed(texts, model=model, **options)

    async def rerank(self, query: str, documents: list[str], model: str | None = None,
                     **options: Any) -> RerankResult:
        """Handle API: ``await handle.rerank.remote(query, documents, model=...)``."""
        return await self.service.rerank(query, documents, model=model, **options)
