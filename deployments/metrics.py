"""Serve metrics (exported on Ray's metrics port), declared once, created in the replica.

Ray exports each as ``ray_<name>`` (counters as ``ray_<name>_total``) and adds the
``deployment``, ``replica`` and ``application`` labels; every label set here takes its
values from a closed set: route templates (unknown paths are ``other``), registry model
ids (unknown ids are ``other``), pool names, hops, priorities and error codes. ``-`` stands for "not
known yet" (a request refused before it was routed). deploy/grafana/blitz.json charts
every metric here, and Serve's own ones in ``SERVE_METRICS_CHARTED``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from ray.serve.metrics import Counter, Gauge, Histogram

from blitz.hop_messages import PRIORITIES
from blitz.ingress.service import RequestRecord
from blitz.pool.model_set import PoolEvents
from blitz.runtime.metric_buffer import MetricBuffer
from deployments.logs import flush_replica_log

SERVE_METRICS_CHARTED = (
    "serve_num_multiplexed_models",  # models resident per pool replica
    "serve_multiplexed_models_unload_counter",  # LRU unloads per pool replica
)
"""Ray Serve's own metrics the dashboard uses, instead of Blitz copies of them."""

RETRY_LATER_REASONS = frozenset({"overloaded", "unavailable", "timeout", "not_ready"})
"""The ``code`` of each 503 error (blitz/errors.py ``RetryLater``): the reason label."""


def _tag_keys(*keys: str) -> tuple[str]:
    """``keys`` as Ray 2.60 annotates ``tag_keys`` (``Tuple[str]``: one key), though it takes any
    number."""
    return keys  # type: ignore[return-value]


LATENCY_BOUNDS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]


class BlitzMetrics:
    """Created lazily so that importing this module never touches Ray. What is recorded
    for every request, model call or queue change (requests, their seconds, texts, tokens,
    503 replies, routing decisions, queue depths, batch sizes) goes through ``buffer``
    (``blitz.runtime.metric_buffer``: gathered, recorded by a background thread once a second);
    rarer events (loads, evictions, refusals, failures) are recorded at once."""

    def __init__(self) -> None:
        self.buffer = MetricBuffer()

    @cached_property
    def requests(self) -> Counter:
        return Counter("blitz_requests",
                       description="requests answered: HTTP by route, handle calls as "
                       "handle.embed, handle.rerank, handle.tokenize, handle.decode",
                       tag_keys=_tag_keys("route", "model", "pool", "status"))

    @cached_property
    def request_seconds(self) -> Histogram:
        return Histogram("blitz_request_seconds",
                         description="time from a request's arrival at the ingress to its "
                         "answer, by route, model and pool",
                         boundaries=LATENCY_BOUNDS_S,
                         tag_keys=_tag_keys("route", "model", "pool"))

    @cached_property
    def tokens(self) -> Counter:
        return Counter("blitz_tokens",
                       description="tokens the models processed for answered requests "
                       "(the usage the reply reports); rate() is tokens per second",
                       tag_keys=_tag_keys("route", "model", "pool"))

    @cached_property
    def unavailable_replies(self) -> Counter:
        return Counter("blitz_503_replies",
                       description="503 replies (with Retry-After) by reason: overloaded, "
                       "unavailable, timeout, not_ready",
                       tag_keys=_tag_keys("route", "pool", "reason"))

    @cached_property
    def waiting_texts(self) -> Gauge:
        return Gauge("blitz_waiting_texts",
                     description="texts waiting for a batch, per replica: hop ingress "
                     "(for a pool call) or pool (for a model call)",
                     tag_keys=_tag_keys("hop", "pool", "model"))

    @cached_property
    def queue_seconds(self) -> Histogram:
        return Histogram("blitz_queue_seconds",
                         description="per batch formed, how long its oldest job waited in "
                         "the queue, by hop (ingress: for a pool call; pool: for a model "
                         "call), pool and the priority it came with (high, normal, low)",
                         boundaries=LATENCY_BOUNDS_S,
                         tag_keys=_tag_keys("hop", "pool", "priority"))

    @cached_property
    def model_evictions(self) -> Counter:
        return Counter("blitz_model_evictions",
                       description="models evicted from a pool replica and freed",
                       tag_keys=_tag_keys("model", "pool"))

    @cached_property
    def texts(self) -> Counter:
        return Counter("blitz_texts", description="texts (or rerank documents) received",
                       tag_keys=_tag_keys("route", "model", "pool"))

    @cached_property
    def images(self) -> Counter:
        return Counter("blitz_images", description="images embedded (a dual encoder's): "
                       "its texts count in blitz_texts", tag_keys=_tag_keys("route", "model",
                                                                          "pool"))

    @cached_property
    def vector_cache_texts(self) -> Counter:
        return Counter("blitz_vector_cache_texts",
                       description="texts looked up in the ingress's vector cache, by "
                       "outcome: hit (answered from memory) or miss (sent to a pool)",
                       tag_keys=_tag_keys("model", "outcome"))

    @cached_property
    def vector_cache_bytes(self) -> Gauge:
        return Gauge("blitz_vector_cache_bytes",
                     description="bytes the ingress replica's vector cache holds",
                     tag_keys=_tag_keys())

    @cached_property
    def route_decisions(self) -> Counter:
        return Counter("blitz_route_decisions",
                       description="routing decisions by pool and reason (blitz.ingress.routing: "
                       "no_gpu, small, size, kind, cold_gpu)",
                       tag_keys=_tag_keys("pool", "reason"))

    @cached_property
    def batch_texts(self) -> Histogram:
        return Histogram("blitz_batch_texts", description="texts per model call",
                         boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
                         tag_keys=_tag_keys("pool"))

    @cached_property
    def padding_efficiency(self) -> Histogram:
        return Histogram("blitz_padding_efficiency",
                         description="real tokens / padded tokens per model call",
                         boundaries=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
                         tag_keys=_tag_keys("pool"))

    @cached_property
    def model_load_seconds(self) -> Histogram:
        return Histogram("blitz_model_load_seconds", description="model load time",
                         boundaries=[0.1, 0.5, 1, 2, 5, 10, 30, 60, 120],
                         tag_keys=_tag_keys("model", "pool"))

    @cached_property
    def model_loads(self) -> Counter:
        return Counter("blitz_model_loads",
                       description="model loads (cache misses) by result",
                       tag_keys=_tag_keys("model", "pool", "result"))

    @cached_property
    def rejected(self) -> Counter:
        return Counter("blitz_rejected",
                       description="requests refused with 503 because a queue was full",
                       tag_keys=_tag_keys("hop"))

    @cached_property
    def pool_failures(self) -> Counter:
        return Counter("blitz_pool_failures",
                       description="pool calls that failed because a replica died or was "
                       "unreachable, by outcome (retried, unavailable)",
                       tag_keys=_tag_keys("pool", "outcome"))

    @cached_property
    def pool_unplaced(self) -> Gauge:
        return Gauge("blitz_pool_unplaced",
                     description="1 while a pool has a replica Ray has not placed for 30 s "
                     "(its claim does not fit what the cluster has free; the ingress logs "
                     "why), else 0; deployments/placement.py",
                     tag_keys=_tag_keys("pool"))

    @cached_property
    def gpu_memory(self) -> Gauge:
        return Gauge("blitz_gpu_memory_bytes",
                     description="CUDA memory of a GPU pool replica per device: kind "
                     "allocated (handed out by torch's caching allocator) or reserved "
                     "(held from the driver); blitz.runtime.gpu_memory",
                     tag_keys=_tag_keys("pool", "device", "kind"))

    def gpu_memory_publisher(self, pool: str) -> Callable[[str, str, int], None]:
        """``blitz.runtime.gpu_memory.report_forever``'s ``publish`` for one pool's replica."""
        return lambda device, kind, value: self.gpu_memory.set(
            value, tags={"pool": pool, "device": device, "kind": kind})

    def observe_request(self, record: RequestRecord, status: int, seconds: float) -> None:
        """The service's observer: one finished request."""
        tags = {"route": record.route, "model": record.model or "-",
                "pool": record.pool or "-"}
        self.buffer.inc(self.requests, 1, {**tags, "status": str(status)})
        self.buffer.observe(self.request_seconds, seconds, tags)
        if record.texts:
            self.buffer.inc(self.texts, record.texts, tags)
        if record.images:
            self.buffer.inc(self.images, record.images, tags)
        if record.tokens:
            self.buffer.inc(self.tokens, record.tokens, tags)
        if record.cache_hits or record.cache_misses:
            for outcome, n in (("hit", record.cache_hits), ("miss", record.cache_misses)):
                if n:
                    self.buffer.inc(self.vector_cache_texts, n,
                                    {"model": tags["model"], "outcome": outcome})
            self.buffer.set(self.vector_cache_bytes, record.cache_bytes, {})
        if status == 503:
            reason = record.error if record.error in RETRY_LATER_REASONS else "other"
            self.buffer.inc(self.unavailable_replies, 1,
                            {"route": record.route, "pool": tags["pool"], "reason": reason})

    def waiting(self, hop: str, pool: str, model: str) -> Callable[[int], None]:
        """A Batcher's ``on_waiting``: sets the queue-depth gauge of one hop and model."""
        tags = {"hop": hop, "pool": pool, "model": model}
        return lambda texts: self.buffer.set(self.waiting_texts, texts, tags)

    def waited(self, hop: str, pool: str) -> Callable[[int, float], None]:
        """A Batcher's ``on_waited``: a batch's priority level and its oldest job's wait."""
        tags = [{"hop": hop, "pool": pool, "priority": name} for name in PRIORITIES]
        return lambda level, seconds: self.buffer.observe(self.queue_seconds, seconds,
                                                          tags[level])

    def observe_batch(self, pool: str, texts: int) -> None:
        """A model call of ``texts`` texts, about to run."""
        self.buffer.observe(self.batch_texts, texts, {"pool": pool})

    def observe_padding(self, pool: str, efficiency: float) -> None:
        """A model call's real tokens over the tokens it computed, padding included."""
        self.buffer.observe(self.padding_efficiency, efficiency, {"pool": pool})

    def pool_events(self, pool: str) -> PoolEvents:
        """A pool replica's events (``blitz.pool.model_set.PoolEvents``) as these metrics,
        and a flush of the replica log after a rare one."""
        def loaded(model: str, seconds: float) -> None:
            self.model_load_seconds.observe(seconds, tags={"model": model, "pool": pool})
            self.model_loads.inc(tags={"model": model, "pool": pool, "result": "loaded"})

        return PoolEvents(
            loaded=loaded,
            load_failed=lambda model: self.model_loads.inc(
                tags={"model": model, "pool": pool, "result": "failed"}),
            evicted=lambda model: self.model_evictions.inc(tags={"model": model, "pool": pool}),
            rejected=lambda: self.rejected.inc(tags={"hop": pool}),
            waiting=lambda model: self.waiting("pool", pool, model),
            waited=self.waited("pool", pool),
            batch=lambda texts: self.observe_batch(pool, texts),
            padding=lambda ratio: self.observe_padding(pool, ratio),
            noted=flush_replica_log)

    def observe_route(self, pool: str, reason: str) -> None:
        self.buffer.inc(self.route_decisions, 1, {"pool": pool, "reason": reason})


metrics = BlitzMetrics()
