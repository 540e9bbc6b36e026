"""An in-process ``Dispatcher``: encoders loaded in this process, run on one worker thread.

Test scaffolding for unit tests of the HTTP API and the service (with fake encoders),
without Ray. Pools here are names only; every job runs on the same local encoders.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from blitz.config import BlitzSettings
from blitz.encoders.base import Encoded, Encoder
from blitz.encoders.loading import load_encoder
from blitz.schemas import EmbedJob, RerankJob


class LocalDispatcher:
    def __init__(self, settings: BlitzSettings, pools: frozenset[str] = frozenset({"cpu"})):
        self.settings = settings
        self.registry = settings.registry()
        self.pools = pools
        self._encoders: dict[str, Encoder] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blitz-local")

    def max_batch(self, pool: str) -> int:
        return self.settings.pool(pool).max_batch_size

    def running_pools(self) -> frozenset[str]:
        return self.pools  # local pools are names only: always running

    def wake(self, pool: str) -> None:
        pass

    async def _run(self, model_id: str, fn_name: str, *args, **kwargs) -> Encoded:
        loop = asyncio.get_running_loop()

        def call() -> Encoded:
            encoder = self._encoders.get(model_id)
            if encoder is None:
                encoder = load_encoder(self.registry.get(model_id), "cpu",
                                       self.settings.resolved_cache_dir())
                self._encoders[model_id] = encoder
            return getattr(encoder, fn_name)(*args, **kwargs)

        return await loop.run_in_executor(self._executor, call)

    async def embed(self, pool: str, model_id: str, job: EmbedJob) -> Encoded:
        if job.token_ids is not None:
            return await self._run(model_id, "embed_tokens", job.token_ids,
                                   normalize=job.normalize, truncate=job.truncate)
        return await self._run(model_id, "embed", job.texts, normalize=job.normalize,
                               truncate=job.truncate)

    async def rerank(self, pool: str, model_id: str, job: RerankJob) -> Encoded:
        return await self._run(model_id, "score", job.query, job.documents,
                               truncate=job.truncate)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
