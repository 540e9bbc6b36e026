"""The ingress's vector cache in process (no Ray): hits equal computed vectors bit for bit,
keys hold every option that changes a vector, memory stays under its bound (LRU), and a
changed model spec never meets an old vector."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from blitz import codecs, timing
from blitz.errors import InputTooLong
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.ingress.vector_cache import ENTRY_OVERHEAD, Key, VectorCache, fingerprint
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, tei_servicer


class CountingDispatcher(ReplicaDispatcher):
    """The replica in process, counting the texts each pool call carried."""

    def __init__(self, settings, pools):
        super().__init__(settings, pools=pools)
        self.sent: list[list[str]] = []

    async def submit(self, pool, model_id, job):
        self.sent.append(list(job.texts or ()))
        return await super().submit(pool, model_id, job)


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
    async with api_client(service) as client:
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


async def test_an_input_too_long_is_named_by_its_index_in_the_request_not_among_misses():
    # the pool sees only the misses: the 413 must name the index in the request, not
    # among the misses
    service, dispatcher = make(models=[{"id": "fake", "source": "fake:16",
                                        "max_seq_length": 4}])
    await service.embed(["a", "b", "c", "d", "e"], model="fake", truncate=False)
    long = "far too many words here"
    for texts, index in ((["a", "b", long], 2), (["a", "q", "b", long, long], 3),
                         (["a", "b", "c", "d", "e", "q", "r", "s", "t", long], 9)):
        with pytest.raises(InputTooLong) as raised:
            await service.embed(texts, model="fake", truncate=False)
        assert raised.value.index == index
        assert raised.value.message.startswith(f"input {index} has ")
    assert max(map(len, dispatcher.sent)) <= 4  # the last one's misses took two chunks


async def test_with_api_keys_each_key_hits_only_the_texts_its_own_clients_sent():
    # a hit shows (server-timing's "hit 1 of 1", gRPC's inference_time_ns=0, the time
    # saved): a shared cache would tell one key's client which texts another key's sent
    service, dispatcher = make(models=[{"id": "fake", "source": "fake:16"}])
    service.settings.auth.api_keys = ["key-a", "key-b"]

    def as_key(key: str) -> dict:
        return {"authorization": f"Bearer {key}", "accept": "application/json"}

    async with api_client(service) as client:
        async def cache_note(key: str) -> str:
            r = await client.post("/embed", json={"texts": ["private text"]},
                                  headers=as_key(key))
            assert r.status_code == 200, r.text
            return r.headers[timing.HEADER].split('desc="')[1].split('"')[0]

        assert await cache_note("key-a") == "hit 0 of 1"
        assert await cache_note("key-b") == "hit 0 of 1"  # a's text is not b's to find
        assert await cache_note("key-a") == "hit 1 of 1"
        assert await cache_note("key-b") == "hit 1 of 1"
    assert dispatcher.sent == [["private text"], ["private text"]]


async def test_a_key_shares_its_cache_entries_across_http_and_grpc_but_not_with_others():
    from blitz.grpc_api import tei_pb2 as pb
    from tests.unit.test_grpc_api import call, served

    service, dispatcher = make(models=[{"id": "fake", "source": "fake:16"}])
    service.settings.auth.api_keys = ["key-a", "key-b"]
    tei = tei_servicer(service)
    async with api_client(service) as client:
        r = await client.post("/embed", json={"texts": ["private text"]},
                              headers={"authorization": "Bearer key-a"})
        assert r.status_code == 200
    async with served(tei) as channel:
        for key in ("key-b", "key-a"):
            await call(channel, "Embed")(pb.EmbedRequest(inputs="private text", truncate=True),
                                         metadata=(("authorization", f"Bearer {key}"),))

            async def one():
                yield pb.EmbedRequest(inputs="private text", truncate=True)  # as HTTP's

            async for _ in call(channel, "EmbedStream")(
                    one(), metadata=(("authorization", f"Bearer {key}"),)):
                pass
    # key-a over HTTP, then key-b's first gRPC call; key-b's stream and key-a's calls hit
    assert dispatcher.sent == [["private text"], ["private text"]]


async def test_off_by_default():
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:16"}]})
    service = EmbeddingService(settings, ReplicaDispatcher(settings))
    assert service.vectors is None
    async with api_client(service) as client:
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
