"""The ingress: HTTP requests and Ray handle calls in, pool calls out."""

from __future__ import annotations

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


class ServeDispatcher:
    """Runs jobs on pool replicas, passing the model id on every hop."""

    def __init__(self, settings: BlitzSettings, handles: dict[str, DeploymentHandle]):
        self.settings = settings
        self.handles = handles
        self.pools = frozenset(handles)

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
        return await self._call(pool, model_id, "embed", job)

    async def rerank(self, pool: str, model_id: str, job: RerankJob) -> Encoded:
        return await self._call(pool, model_id, "rerank", job)


@serve.deployment
class Ingress:
    def __init__(self, settings: dict[str, Any], cpu_pool: DeploymentHandle,
                 gpu_pool: DeploymentHandle | None = None):
        self.settings = BlitzSettings.from_args(settings)
        handles = {"cpu": cpu_pool} | ({"gpu": gpu_pool} if gpu_pool is not None else {})
        self.service = EmbeddingService(self.settings, ServeDispatcher(self.settings, handles))
        self.api = HttpApi(self.service, observe=metrics.observe_request)

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
