"""One model id gives one vector per text in each pool, whatever it was batched with: the
same texts sent alone (one call each, all at once, so the pool's batcher merges them),
in jobs of 4, and spread inside 64 texts of other lengths agree to a cosine of 0.9999 or
better, on the CPU pool (int8 included) and on the GPU pool."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from blitz.hop_messages import EmbedJob
from tests.integration.conftest import APP, CPU_BATCH, GPU_BATCH
from tests.same_vector import OTHERS, TEXTS, min_cosine


@pytest.mark.parametrize(("pool", "model"), [
    ("CPUPool", "minilm-int8"), ("CPUPool", "minilm"), ("CPUPool", "tiny-a"),
    ("GPUPool", "minilm"), ("GPUPool", "tiny-a")])
async def test_a_text_gets_one_vector_whatever_its_batch(blitz_app, pool, model):
    from ray import serve

    handle = serve.get_deployment_handle(pool, APP).options(multiplexed_model_id=model)
    limit = CPU_BATCH if pool == "CPUPool" else GPU_BATCH

    async def embed(jobs: list[list[str]]) -> np.ndarray:
        results = await handle.run_jobs.remote([EmbedJob(texts=texts) for texts in jobs])
        assert not any(isinstance(r, BaseException) for r in results), results
        return np.concatenate([r.values for r in results])

    alone = np.concatenate(await asyncio.gather(*(embed([[t]]) for t in TEXTS)))
    fours = await embed([TEXTS[i:i + 4] for i in range(0, len(TEXTS), 4)])
    mixed = OTHERS[:28] + TEXTS + OTHERS[28:]  # 64 texts; ours in the middle
    inside = (await embed([mixed[i:i + limit] for i in range(0, len(mixed), limit)]))[28:36]
    assert min_cosine(alone, fours) >= 0.9999
    assert min_cosine(alone, inside) >= 0.9999
