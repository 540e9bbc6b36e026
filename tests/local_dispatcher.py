"""An in-process ``Dispatcher``: encoders loaded in this process, run on one worker thread.

Test scaffolding for unit tests of the HTTP API and the service (with fake encoders),
without Ray. Pools here are names only; every job runs on the same local encoders.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from blitz.encoders.base import Encoded, Encoder
from blitz.loading.load import load_encoder
from blitz.pool.mixed_batch import Job, run_jobs
from blitz.settings.config import BlitzSettings


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

    def unplaced_pools(self) -> dict[str, str]:
        return {}

    async def submit(self, pool: str, model_id: str, job: Job) -> Encoded:
        """``job`` on this process's encoder for ``model_id``, as a pool batch runs it;
        every pool is this one."""
        loop = asyncio.get_running_loop()

        def call() -> Encoded | Exception:
            encoder = self._encoders.get(model_id)
            if encoder is None:
                encoder = load_encoder(self.registry.get(model_id), "cpu",
                                       self.settings.resolved_cache_dir())
                self._encoders[model_id] = encoder
            return run_jobs(encoder, [job])[0]

        result = await loop.run_in_executor(self._executor, call)
        if isinstance(result, Exception):
            raise result
        return result

    def close(self) -> None:
        self._executor.shutdown(wait=False)
