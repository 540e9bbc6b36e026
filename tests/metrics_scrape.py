"""Reading the session Ray's Prometheus endpoint (its metrics agent), for the Ray tiers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

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


def scrape_until(url: str, ready: Callable[[list[Sample]], bool],
                 timeout_s: float = 90) -> list[Sample]:
    """Scrape until ``ready(samples)``: Ray's agent exports every few seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        if ready(samples):
            return samples
        if time.monotonic() > deadline:
            pytest.fail(f"metrics at {url} not as expected within {timeout_s:g} s; "
                        f"blitz series: {sorted({s.name for s in samples if 'blitz' in s.name})}")
        time.sleep(2)


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
