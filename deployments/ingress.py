"""The ingress: HTTP requests and Ray handle calls in, pool calls out."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from blitz.config import BlitzSettings
from blitz.encoders.base import Encoded
from blitz.errors import Overloaded
from blitz.http_api import HttpApi
from blitz.schemas import EmbedJob, EmbedResult, RerankJob, RerankResult
from blitz.service import EmbeddingService
from deployments.metrics import metrics


@dataclass(frozen=True)
class _Pending:
    pool: str
    model_id: str
    job: EmbedJob


class ServeDispatcher:
    """Runs jobs on pool replicas, passing the model id on every hop."""

    def __init__(self, settings: BlitzSettings, handles: dict[str, DeploymentHandle]):
        self.settings = settings
        self.handles = handles
        self.pools = frozenset(handles)
        self._coalesced.set_max_batch_size(settings.cpu_pool.max_batch_size)

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
        if pool == "cpu" and job.texts is not None and len(job) < self.max_batch(pool):
            result = await self._coalesced(_Pending(pool, model_id, job))
            if isinstance(result, BaseException):
                raise result
            return result
        return await self._call(pool, model_id, "embed", job)

    @serve.batch(max_batch_size=128, batch_wait_timeout_s=0.002,
                 batch_size_fn=lambda items: sum(len(p.job) for p in items))
    async def _coalesced(self, items: list[_Pending]) -> list[Encoded | BaseException]:
        """Concurrent small requests for the same model and options become one pool call."""
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(items):
            key = (p.pool, p.model_id, p.job.normalize, p.job.truncate)
            groups.setdefault(key, []).append(i)
        results: list[Encoded | BaseException] = [None] * len(items)  # type: ignore[list-item]

        async def run(key: tuple, members: list[int]) -> None:
            pool, model_id, normalize, truncate = key
            if len(members) == 1:
                texts_jobs = [items[members[0]].job]
            else:
                texts_jobs = [EmbedJob(texts=[t for i in members for t in items[i].job.texts],
                                       normalize=normalize, truncate=truncate)]
            try:
                merged = await self._call(pool, model_id, "embed", texts_jobs[0])
            except Exception as exc:
                if len(members) == 1:
                    results[members[0]] = exc
                    return
                # one request's bad input must not fail the others: run them one by one
                for i in members:
                    try:
                        results[i] = await self._call(pool, model_id, "embed", items[i].job)
                    except Exception as one:
                        results[i] = one
                return
            start = 0
            for i in members:
                n = len(items[i].job)
                results[i] = Encoded(merged.values[start:start + n],
                                     merged.token_counts[start:start + n],
                                     merged.padded_tokens * n // max(len(merged.values), 1))
                start += n

        await asyncio.gather(*(run(k, m) for k, m in groups.items()))
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
