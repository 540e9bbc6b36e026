"""Repeated texts answered without the model: a bounded LRU of computed vectors, on the
ingress (``ingress.vector_cache_mb``; off by default).

Blitz gives one vector per text whatever it was batched with, so a text the ingress has
already had embedded (a popular query, a re-indexed document) can be answered from
memory, bit for bit the vector the model gave. A key holds everything that changes that
vector: the model id and a fingerprint of its spec (a redeploy that changes the model's
source, backend or length never meets an old vector), the pool (the GPU pool's fp16
vectors are not the CPU pool's), ``normalize``, ``truncate``, and the exact text after its
prompt. ``dimensions`` and ``dtype`` are applied after the cache, so every choice of them
shares one entry. Token-id inputs are not cached.

With API keys on, the key also holds the caller's API key (its index among
``auth.api_keys``): a hit shows in a reply (``server-timing``, gRPC's
``inference_time_ns``, and the time it saves), so entries are kept per key, and one key's
client can never learn which texts another's sent (docs/operations.md).

What it holds is bounded in bytes (vectors, texts and a fixed overhead per entry); the
least recently used entries go first. Its state is plain dicts touched only on the event
loop, with no await in between: a caller that leaves mid-request leaves nothing half
written.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import numpy as np

from blitz import timing
from blitz.encoders.base import Encoded, stacked
from blitz.errors import InputTooLong
from blitz.hop_messages import EmbedOptions
from blitz.settings.registry import ModelSpec

ENTRY_OVERHEAD = 240  # bytes per entry besides its vector and text: key tuple, dict slot


class Key(NamedTuple):
    model: str
    pool: str
    normalize: bool
    truncate: bool
    text: str
    api_key: int = -1  # whose entry: one API key's requests never meet another's
    side: str = ""  # the request's truncation_side; "": the model's
    long_inputs: str = ""  # the request's long_inputs; "": the model's


class Entry(NamedTuple):
    vector: np.ndarray  # float32, read-only
    tokens: int
    size: int


def fingerprint(spec: ModelSpec) -> str:
    """What identifies ``spec``'s vectors: its id and a hash of everything in it."""
    digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16]
    return f"{spec.id}@{digest}"


class VectorCache:
    """A bounded LRU of (vector, token count) by ``Key``; ``max_bytes`` over all models."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[Key, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Key, vector: np.ndarray, tokens: int) -> None:
        """Hold a copy of ``vector`` (a row of a reply: the reply's array stays the
        caller's) unless it alone is over the bound."""
        size = vector.nbytes + sys.getsizeof(key.text) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        held = np.array(vector, dtype=np.float32, copy=True)
        held.flags.writeable = False
        self._entries[key] = Entry(held, tokens, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= dropped.size


Computed = tuple[np.ndarray, np.ndarray, list[Any]]
"""A pool's answer for some texts: float32 rows, token counts, the parts (with timings)."""
Compute = Callable[[list[str]], Awaitable[Computed]]


def joined(parts: list[Encoded]) -> Computed:
    """The parts' rows and token counts as one array each, and the parts."""
    if len(parts) == 1:
        return parts[0].values, parts[0].token_counts, parts
    return stacked(parts), np.concatenate([p.token_counts for p in parts]), parts


class CachedEmbedder:
    """The service's way through the cache: hits from memory, misses (each distinct text
    once) from ``compute``, the rows put back in request order."""

    def __init__(self, max_bytes: int):
        self.cache = VectorCache(max_bytes)
        self._fingerprints: dict[str, str] = {}  # model id -> its spec's

    def forget(self, model_id: str) -> None:
        """Key ``model_id``'s texts by its spec anew (the admin API changed it)."""
        self._fingerprints.pop(model_id, None)

    def through(self, record: Any, options: EmbedOptions) -> Callable[
            [ModelSpec, str, list[str], Callable[[list[str]], Awaitable[list[Encoded]]]],
            Awaitable[list[Encoded]]]:
        """The cache between an embedding request's texts and its pool
        (``blitz.ingress.service.Through``), keyed by the model's spec, the pool and the
        request's ``options`` that change a row: its parts are one, the texts' rows in order, timed with the
        pool's slowest part and the cache's own ``cache``."""
        async def through(spec: ModelSpec, pool: str, texts: list[str],
                          send: Callable[[list[str]], Awaitable[list[Encoded]]]
                          ) -> list[Encoded]:
            async def rows(some: list[str]) -> Computed:
                return joined(await send(some))

            print_ = (self._fingerprints.get(spec.id)
                      or self._fingerprints.setdefault(spec.id, fingerprint(spec)))
            key = Key(print_, pool, options.normalized(spec.normalize), options.truncate, "",
                      record.api_key, options.truncation_side or "", options.long_inputs or "")
            values, counts, parts, cache_s = await self.embed(key, texts, rows, record)
            return [Encoded(values, counts,
                            timings={**timing.slowest(parts), "cache": cache_s})]

        return through

    async def embed(self, base: Key, texts: list[str], compute: Compute,
                    record: Any) -> tuple[np.ndarray, np.ndarray, list[Any], float]:
        """Rows and token counts for ``texts`` (``base`` with each text as its key), the
        parts ``compute`` returned, and the seconds spent in the cache. ``record`` (a
        ``RequestRecord``) gets the hits, misses and bytes held."""
        started = time.perf_counter()
        keys = [base._replace(text=t) for t in texts]
        found = [self.cache.get(k) for k in keys]
        missing: dict[str, list[int]] = {}
        for i, entry in enumerate(found):
            if entry is None:
                missing.setdefault(texts[i], []).append(i)
        spent = time.perf_counter() - started
        record.cache_hits, record.cache_misses = len(texts) - len(missing), len(missing)
        parts: list[Any] = []
        if missing:
            try:
                rows, counts, parts = await compute(list(missing))
            except InputTooLong as exc:  # named among the misses: name it in the request
                raise exc.at(list(missing.values())[exc.index][0], exc.tokens,
                             exc.limit) from None
        started = time.perf_counter()
        if not missing:
            values = np.stack([e.vector for e in found if e is not None])
            tokens = np.fromiter((e.tokens for e in found if e is not None), dtype=np.int64,
                                 count=len(found))
        else:
            values = np.empty((len(texts), rows.shape[1]), dtype=rows.dtype)
            tokens = np.empty(len(texts), dtype=np.int64)
            for i, entry in enumerate(found):
                if entry is not None:
                    values[i], tokens[i] = entry.vector, entry.tokens
            for j, where in enumerate(missing.values()):
                values[where], tokens[where] = rows[j], counts[j]
                self.cache.put(keys[where[0]], rows[j], int(counts[j]))
        record.cache_bytes = self.cache.bytes
        return values, tokens, parts, spent + time.perf_counter() - started
