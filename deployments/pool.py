"""The model pool: one class, bound as the CPU pool and (when GPUs exist) the GPU pool.

Each replica holds up to three models (``@serve.multiplexed``, LRU) and batches
concurrent requests per model with ``@serve.batch``; model work runs on one worker
thread, never on the replica's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ray import serve

from blitz.batching import Coalescer
from blitz.config import BlitzSettings
from blitz.encoders import load_encoder, resolve_device
from blitz.encoders.base import Encoded
from blitz.encoders.holder import ModelHolder
from blitz.errors import BlitzError, ModelLoadFailed
from blitz.schemas import EmbedJob, RerankJob
from deployments.ingress import route_library_logs_to_serve
from deployments.metrics import metrics

logger = logging.getLogger("ray.serve")
MAX_MODELS_PER_REPLICA = 3


def _count_texts(jobs: list[EmbedJob]) -> int:
    return sum(len(job) for job in jobs)


@serve.deployment
class ModelPool:
    def __init__(self, settings: dict[str, Any], pool: str):
        self.settings = BlitzSettings.from_args(settings)
        self.registry = self.settings.registry()
        self.pool = pool
        self.pool_settings = self.settings.gpu_pool if pool == "gpu" else self.settings.cpu_pool
        self.device = resolve_device("cuda" if pool == "gpu" else "cpu")
        self.cache_dir = self.settings.resolved_cache_dir()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"blitz-{pool}")
        if self.pool_settings.torch_threads:
            import torch

            torch.set_num_threads(self.pool_settings.torch_threads)
        self._embed_batch.set_max_batch_size(self.pool_settings.max_batch_size)
        self._embed_batch.set_batch_wait_timeout_s(self.pool_settings.batch_wait_timeout_s)
        route_library_logs_to_serve()
        self._lanes: dict[str, Coalescer] = {}
        self.loaded: list[str] = []  # resident models, least recently loaded first
        self.evicted: list[str] = []

    async def _in_worker(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # ---- models ----------------------------------------------------------------------

    @serve.multiplexed(max_num_models_per_replica=MAX_MODELS_PER_REPLICA)
    async def get_model(self, model_id: str) -> ModelHolder:
        spec = self.registry.get(model_id)  # only registered ids ever load
        started = time.perf_counter()

        def load():
            encoder = load_encoder(spec, self.device, self.cache_dir)
            encoder.warmup()
            return encoder

        try:
            encoder = await self._in_worker(load)
        except BlitzError:
            metrics.model_loads.inc(tags={"model": model_id, "pool": self.pool,
                                          "result": "failed"})
            raise
        except Exception as exc:
            raise ModelLoadFailed(f"model {model_id!r} failed to load: {exc}") from exc
        seconds = time.perf_counter() - started
        metrics.model_load_seconds.observe(seconds, tags={"model": model_id, "pool": self.pool})
        metrics.model_loads.inc(tags={"model": model_id, "pool": self.pool, "result": "loaded"})
        logger.info("loaded model %r on %s in %.2fs", model_id, self.device, seconds)
        self.loaded.append(model_id)
        return ModelHolder(encoder, on_release=self._released)

    def _released(self, model_id: str) -> None:
        if model_id in self.loaded:
            self.loaded.remove(model_id)
        self.evicted.append(model_id)
        logger.info("evicted model %r", model_id)

    async def _encoder(self):
        return (await self.get_model(serve.get_multiplexed_model_id())).get()

    # ---- work ------------------------------------------------------------------------

    async def embed(self, job: EmbedJob) -> Encoded:
        """Embed one job (texts or token ids) with the request's multiplexed model."""
        limit = self.pool_settings.max_batch_size
        if len(job) > limit:  # handle callers that skip the ingress still get chunking
            parts = await asyncio.gather(*(
                self.embed(_slice(job, i, limit)) for i in range(0, len(job), limit)))
            return _concat(parts)
        if job.token_ids is not None:
            encoder = await self._encoder()
            return await self._in_worker(
                lambda: encoder.embed_tokens(job.token_ids, normalize=job.normalize,
                                             truncate=job.truncate))
        result = await self._embed_batch(job)
        if isinstance(result, BaseException):
            raise result
        return result

    @serve.batch(max_batch_size=128, batch_wait_timeout_s=0.005, batch_size_fn=_count_texts,
                 max_concurrent_batches=64)
    async def _embed_batch(self, jobs: list[EmbedJob]) -> list[Encoded | BaseException]:
        """One model's concurrent requests (Serve splits batches by multiplexed model id).

        Serve forms these batches before a slot is free, so under load they are small;
        the model's lane merges all that wait while the model is busy into one call.
        """
        model_id = serve.get_multiplexed_model_id()
        lane = self._lanes.get(model_id)
        if lane is None:
            lane = self._lanes[model_id] = Coalescer(
                partial(self._embed_jobs, model_id),
                max_size=self.pool_settings.max_batch_size, size=len)
        return await asyncio.gather(*(lane.submit(job) for job in jobs),
                                    return_exceptions=True)

    async def _embed_jobs(self, model_id: str, jobs: list[EmbedJob]) -> list:
        encoder = (await self.get_model(model_id)).get()
        metrics.batch_texts.observe(_count_texts(jobs), tags={"pool": self.pool})
        results = await self._in_worker(
            encoder.embed_many, [(j.texts, j.normalize, j.truncate) for j in jobs])
        real = sum(int(r.token_counts.sum()) for r in results if isinstance(r, Encoded))
        padded = sum(r.padded_tokens for r in results if isinstance(r, Encoded))
        if padded:
            metrics.padding_efficiency.observe(real / padded, tags={"pool": self.pool})
        return results

    async def rerank(self, job: RerankJob) -> Encoded:
        encoder = await self._encoder()
        return await self._in_worker(
            lambda: encoder.score(job.query, job.documents, truncate=job.truncate))

    async def stats(self) -> dict[str, Any]:
        """What this replica holds: for tests and operators."""
        return {"pool": self.pool, "device": self.device, "loaded": list(self.loaded),
                "evicted": list(self.evicted)}


def _slice(job: EmbedJob, start: int, size: int) -> EmbedJob:
    if job.token_ids is not None:
        return EmbedJob(token_ids=job.token_ids[start:start + size], normalize=job.normalize,
                        truncate=job.truncate)
    return EmbedJob(texts=job.texts[start:start + size], normalize=job.normalize,
                    truncate=job.truncate)


def _concat(parts: list[Encoded]) -> Encoded:
    import numpy as np

    return Encoded(np.concatenate([p.values for p in parts]),
                   np.concatenate([p.token_counts for p in parts]),
                   sum(p.padded_tokens for p in parts))
