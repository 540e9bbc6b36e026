"""The ingress's vector cache in process (no Ray): hits equal computed vectors bit for bit,
keys hold every option that changes a vector, memory stays under its bound (LRU), and a
changed model spec never meets an old vector."""

from __future__ import annotations

import sys

import httpx
import numpy as np
import pytest

from blitz import codecs, timing
from blitz.http.api import HttpApi
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.ingress.vector_cache import ENTRY_OVERHEAD, Key, VectorCache, fingerprint
from blitz.settings.config import BlitzSettings
from tests.local_dispatcher import LocalDispatcher


class CountingDispatcher(LocalDispatcher):
    """The local encoders, counting the texts each pool call carried."""

    def __init__(self, settings, pools):
        super().__init__(settings, pools)
        self.sent: list[list[str]] = []

    async def embed(self, pool, model_id, job):
        self.sent.append(list(job.texts or ()))
        return await super().embed(pool, model_id, job)


def make(cache_mb: float = 1.0, models: list | None = None):
    settings = BlitzSettings.from_args({
        "models": models or [{"id": "fake", "source": "fake:16"},
                             {"id": "other", "source": "fake:8"}],
        "ingress": {"vector_cache_mb": cache_mb},
        "cpu_pool": {"max_batch_size": 4},
    })
    dispatcher = CountingDispatcher(settings, frozenset({"cpu"}))
    return EmbeddingService(settings, dispatcher), dispatcher


async def test_a_hit_is_the_computed_vector_bit_for_bit_and_skips_the_pool():
    service, dispatcher = make()
    uncached, _ = make(cache_mb=0)
    texts = ["a", "b", "c", "d", "e", "f"]
    first = await service.embed(texts, model="fake")
    assert sum(map(len, dispatcher.sent)) == 6
    again = await service.embed(["c", "z", "a", "c"], model="fake")
    assert dispatcher.sent[-1] == ["z"]  # only the miss went to the pool, once
    computed = await uncached.embed(["c", "z", "a", "c"], model="fake")
    assert again.embeddings.tobytes() == computed.embeddings.tobytes()
    assert again.embeddings[0].tobytes() == first.embeddings[2].tobytes()
    assert again.usage == computed.usage


async def test_options_after_the_cache_share_an_entry_those_before_do_not():
    service, dispatcher = make()
    await service.embed(["a"], model="fake")
    sliced = await service.embed(["a"], model="fake", dimensions=4, dtype="int8")
    assert len(dispatcher.sent) == 1
    plain, _ = make(cache_mb=0)
    expected = await plain.embed(["a"], model="fake", dimensions=4, dtype="int8")
    assert sliced.embeddings.tobytes() == expected.embeddings.tobytes()
    await service.embed(["a"], model="fake", normalize=False)
    await service.embed(["a"], model="fake", truncate=False)
    await service.embed(["a"], model="other")
    await service.embed(["query: a"], model="fake")
    assert len(dispatcher.sent) == 5  # each of these is a key of its own
    await service.embed("a", model="fake", token_ids=None)
    assert len(dispatcher.sent) == 5


async def test_token_id_inputs_bypass_the_cache():
    service, dispatcher = make()
    record = RequestRecord("/v1/embeddings")
    await service.embed(token_ids=[[1, 2]], model="fake", record=record)
    await service.embed(token_ids=[[1, 2]], model="fake")
    assert len(dispatcher.sent) == 2 and record.cache_hits == record.cache_misses == 0


async def test_the_record_counts_hits_and_misses_and_the_header_says_so():
    service, _ = make()
    api = HttpApi(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(api),
                                 base_url="http://blitz") as client:
        await client.post("/embed", json={"texts": ["a", "b"], "model": "fake"})
        r = await client.post("/embed", json={"texts": ["a", "b", "c"], "model": "fake"},
                              headers={"accept": "application/json"})
    assert r.status_code == 200
    header = r.headers[timing.HEADER]
    assert 'cache;dur=' in header and 'desc="hit 2 of 3"' in header
    assert "cache" in timing.parse_header(header)
    record = RequestRecord("/embed")
    await service.embed(["a", "q"], model="fake", record=record)
    assert (record.cache_hits, record.cache_misses) == (1, 1)
    assert record.cache_bytes == service.vectors.cache.bytes > 0


async def test_off_by_default():
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:16"}]})
    service = EmbeddingService(settings, LocalDispatcher(settings, frozenset({"cpu"})))
    assert service.vectors is None
    async with httpx.AsyncClient(transport=httpx.ASGITransport(HttpApi(service)),
                                 base_url="http://blitz") as client:
        r = await client.post("/embed", content=codecs.pack({"texts": ["a"]}),
                              headers={"content-type": "application/msgpack"})
    assert "cache" not in timing.parse_header(r.headers[timing.HEADER])


def test_memory_stays_under_the_bound_least_recently_used_first():
    row = np.ones(100, dtype=np.float32)
    size = row.nbytes + sys.getsizeof("t0") + ENTRY_OVERHEAD
    cache = VectorCache(max_bytes=3 * size + 10)
    keys = [Key("m", "cpu", True, True, f"t{i}") for i in range(5)]
    for key in keys[:3]:
        cache.put(key, row, 1)
    assert len(cache) == 3 and cache.bytes <= cache.max_bytes
    assert cache.get(keys[0]) is not None  # now the most recent
    cache.put(keys[3], row, 1)
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None
    assert len(cache) == 3 and cache.bytes <= cache.max_bytes
    cache.put(Key("m", "cpu", True, True, "x" * 10_000), row, 1)  # alone over the bound
    assert cache.get(Key("m", "cpu", True, True, "x" * 10_000)) is None and len(cache) == 3


def test_held_vectors_are_copies_nobody_can_change():
    cache = VectorCache(1 << 20)
    row = np.arange(4, dtype=np.float32)
    key = Key("m", "cpu", True, True, "t")
    cache.put(key, row, 2)
    row[:] = 0
    entry = cache.get(key)
    assert entry is not None and entry.vector.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        entry.vector[0] = 9


def test_a_changed_spec_is_another_fingerprint():
    a = BlitzSettings.from_args({"models": [{"id": "m", "source": "fake:16"}]}).registry()
    b = BlitzSettings.from_args({"models": [{"id": "m", "source": "fake:16",
                                             "max_seq_length": 64}]}).registry()
    assert fingerprint(a.get("m")) != fingerprint(b.get("m"))
    assert fingerprint(a.get("m")) == fingerprint(a.get("m"))
