"""Reading the session Ray's Prometheus endpoint (its metrics agent), for the Ray tiers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import wait_until, wait_until_async

# what Ray and Serve add to every Blitz series, besides the tag keys in deployments/metrics.py
SERVE_LABELS = frozenset({"deployment", "replica", "application"})


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def metrics_url() -> str:
    """The head node's metrics export URL (``ray.init`` picks the port)."""
    import ray

    node = next(n for n in ray.nodes() if n["Alive"])
    return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"


def scrape(url: str, prefix: str = "ray_") -> list[Sample]:
    text = httpx.get(url, timeout=10).text
    return [Sample(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith(prefix)]


SCRAPE_EVERY_S = 2  # Ray's agent exports every few seconds


class _Scrapes:
    """The latest scrape of ``url``, and whether ``ready`` accepts it."""

    def __init__(self, url: str, ready: Callable[[list[Sample]], bool]):
        self.url, self.ready, self.latest = url, ready, list[Sample]()

    def check(self) -> list[Sample] | None:
        self.latest = scrape(self.url)
        return self.latest if self.ready(self.latest) else None

    def what(self) -> str:
        return (f"the metrics at {self.url}; blitz series: "
                f"{sorted({s.name for s in self.latest if 'blitz' in s.name})}")


def scrape_until(url: str, ready: Callable[[list[Sample]], bool],
                 timeout_s: float = 90) -> list[Sample]:
    """Scrape until ``ready(samples)``, blocking: for sync tests."""
    scrapes = _Scrapes(url, ready)
    return wait_until(scrapes.check, scrapes.what, timeout_s, interval_s=SCRAPE_EVERY_S)


async def scrape_until_async(url: str, ready: Callable[[list[Sample]], bool],
                             timeout_s: float = 90) -> list[Sample]:
    """``scrape_until`` for async tests: each scrape runs on a thread, so the event loop
    (and the test's clients on it) keeps running meanwhile."""
    scrapes = _Scrapes(url, ready)
    return await wait_until_async(lambda: asyncio.to_thread(scrapes.check), scrapes.what,
                                  timeout_s, interval_s=SCRAPE_EVERY_S)


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def declared_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric ``deployments/metrics.py`` declares: name -> (kind, tag keys)."""
    from functools import cached_property

    from deployments.metrics import BlitzMetrics

    fresh = BlitzMetrics()
    found = {}
    for attr, value in vars(BlitzMetrics).items():
        if isinstance(value, cached_property):
            metric = getattr(fresh, attr)
            found[metric.info["name"]] = (type(metric).__name__, tuple(metric.info["tag_keys"]))
    return found


def exported_names(name: str, kind: str) -> list[str]:
    """The sample names Ray exports for one metric."""
    if kind == "Counter":
        return [f"ray_{name}_total"]
    if kind == "Histogram":
        return [f"ray_{name}_{part}" for part in ("bucket", "sum", "count")]
    return [f"ray_{name}"]
