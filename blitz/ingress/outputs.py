"""A model's other outputs, beside its sentence embedding: per-token vectors
(``/embed_all``, Hugging Face TEI's shape, for late-interaction retrieval).

Each runs as a job of its own kind (``blitz.schemas``) through the same queue, pool and
batcher as embeddings, routed and limited by the same rules, and answered one result per
text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from blitz import timing
from blitz.errors import InvalidValue
from blitz.schemas import TokenEmbeddingsResult, TokenEmbedJob, Usage
from blitz.settings.registry import apply_prompt

if TYPE_CHECKING:
    from blitz.ingress.service import EmbeddingService, RequestRecord


class OutputService:
    """``embed_all`` for HTTP and handle calls, on ``service``'s dispatcher."""

    def __init__(self, service: EmbeddingService):
        self.service = service

    async def embed_all(self, texts: str | list[str], *, model: str | None = None,
                        truncate: bool = True, prompt_name: str | None = None,
                        record: RequestRecord | None = None) -> TokenEmbeddingsResult:
        """Each text's token vectors (special tokens included, no padding) from an
        embedding model's last layer before pooling."""
        service = self.service
        with service.recorded(record, "handle.embed_all") as record:
            items = [texts] if isinstance(texts, str) else list(texts or ())
            record.texts, record.model = len(items), model or ""
            spec = service.spec(model)
            record.model = spec.id
            if spec.kind != "embedding":
                raise InvalidValue(f"model {spec.id!r} is a {spec.kind}; per-token "
                                   "embeddings come from embedding models", param="model")
            service.check_texts(items)
            items = apply_prompt(spec, items, prompt_name)
            pool = service.route(spec.kind, len(items)).pool
            size = service.dispatcher.max_batch(pool)
            jobs = [TokenEmbedJob(items[i:i + size], truncate)
                    for i in range(0, len(items), size)]
            parts = await service.gather(
                [service.dispatcher.submit(pool, spec.id, job) for job in jobs], size)
            rows: list[np.ndarray] = []
            for part in parts:
                ends = np.cumsum(part.token_counts)
                rows += np.split(part.values, ends[:-1])
            tokens = int(sum(int(p.token_counts.sum()) for p in parts))
            record.pool, record.tokens, record.timings = pool, tokens, timing.slowest(parts)
            return TokenEmbeddingsResult(rows, spec.id, Usage.of(tokens), pool)
