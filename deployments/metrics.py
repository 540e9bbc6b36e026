"""Serve metrics (exported on Ray's metrics port), declared once, created in the replica."""

from __future__ import annotations

from functools import cached_property

from ray.serve.metrics import Counter, Histogram


class BlitzMetrics:
    """Created lazily so that importing this module never touches Ray."""

    @cached_property
    def requests(self) -> Counter:
        return Counter("blitz_requests",
                       description="requests answered: HTTP by route, handle calls as "
                       "handle.embed and handle.rerank",
                       tag_keys=("route", "model", "pool", "status"))

    @cached_property
    def texts(self) -> Counter:
        return Counter("blitz_texts", description="texts (or rerank documents) received",
                       tag_keys=("route", "model", "pool"))

    @cached_property
    def route_decisions(self) -> Counter:
        return Counter("blitz_route_decisions",
                       description="routing decisions by pool and reason (blitz.routing: "
                       "no_gpu, small, size, kind, cold_gpu)",
                       tag_keys=("pool", "reason"))

    @cached_property
    def batch_texts(self) -> Histogram:
        return Histogram("blitz_batch_texts", description="texts per model call",
                         boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
                         tag_keys=("pool",))

    @cached_property
    def padding_efficiency(self) -> Histogram:
        return Histogram("blitz_padding_efficiency",
                         description="real tokens / padded tokens per model call",
                         boundaries=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
                         tag_keys=("pool",))

    @cached_property
    def model_load_seconds(self) -> Histogram:
        return Histogram("blitz_model_load_seconds", description="model load time",
                         boundaries=[0.1, 0.5, 1, 2, 5, 10, 30, 60, 120],
                         tag_keys=("model", "pool"))

    @cached_property
    def model_loads(self) -> Counter:
        return Counter("blitz_model_loads",
                       description="model loads (cache misses) by result",
                       tag_keys=("model", "pool", "result"))

    @cached_property
    def rejected(self) -> Counter:
        return Counter("blitz_rejected",
                       description="requests refused with 503 because a queue was full",
                       tag_keys=("hop",))

    @cached_property
    def pool_failures(self) -> Counter:
        return Counter("blitz_pool_failures",
                       description="pool calls that failed because a replica died or was "
                       "unreachable, by outcome (retried, unavailable)",
                       tag_keys=("pool", "outcome"))

    def observe_request(self, route: str, model: str, pool: str, status: int,
                        n_texts: int) -> None:
        tags = {"route": route, "model": model or "-", "pool": pool or "-"}
        self.requests.inc(tags={**tags, "status": str(status)})
        if n_texts:
            self.texts.inc(n_texts, tags=tags)

    def observe_route(self, pool: str, reason: str) -> None:
        self.route_decisions.inc(tags={"pool": pool, "reason": reason})


metrics = BlitzMetrics()
