"""The metrics' recording (fake metric objects, no Ray) and the Grafana dashboard built
from their names: every query names a declared metric and groups by its labels, and
every metric is on a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deployments.metrics import SERVE_METRICS_CHARTED, BlitzMetrics
from tests.metrics_scrape import SERVE_LABELS, declared_metrics, exported_names

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "blitz.json"
EXPORTED = re.compile(r"\bray_([a-z0-9_]+?)(?:_total|_bucket|_sum|_count)?\b")
GROUPED = re.compile(r"\bby \(([^)]*)\)")
SAMPLE = re.compile(r"\bray_[a-z0-9_]+")


class FakeMetric:
    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def inc(self, value=1, tags=None):
        self.calls.append((self.name, value, tags))

    def observe(self, value, tags=None):
        self.calls.append((self.name, value, tags))

    def set(self, value, tags=None):
        self.calls.append((self.name, value, tags))


def fake_metrics() -> tuple[BlitzMetrics, list]:
    calls: list = []
    metrics = BlitzMetrics()
    for name in ("requests", "request_seconds", "texts", "images", "tokens",
                 "unavailable_replies",
                 "route_decisions", "waiting_texts", "gpu_memory", "batch_texts",
                 "padding_efficiency"):
        setattr(metrics, name, FakeMetric(calls, name))  # shadows the cached_property
    return metrics, calls


def recorded(metrics: BlitzMetrics, calls: list) -> list:
    """What reached the metrics: the buffer flushed now, not by its thread a second later."""
    metrics.buffer.flush()
    return calls


def test_a_served_request_is_counted_timed_and_its_tokens_added():
    from blitz.ingress.service import RequestRecord

    metrics, calls = fake_metrics()
    metrics.observe_request(RequestRecord("/embed", "minilm", "gpu", texts=12, tokens=96),
                            200, 0.25)
    tags = {"route": "/embed", "model": "minilm", "pool": "gpu"}
    assert recorded(metrics, calls) == [
        ("requests", 1, {**tags, "status": "200"}), ("texts", 12, tags), ("tokens", 96, tags),
        ("request_seconds", 0.25, tags)]  # routing decisions: observe_route


def test_images_are_counted_apart_from_texts():
    from blitz.ingress.service import RequestRecord

    metrics, calls = fake_metrics()
    metrics.observe_request(RequestRecord("/embed", "clip", "gpu", images=5), 200, 0.5)
    metrics.observe_request(RequestRecord("/rerank", "clip", "cpu", texts=1, images=2,
                                          tokens=4), 200, 0.1)
    tags = {"route": "/embed", "model": "clip", "pool": "gpu"}
    other = {"route": "/rerank", "model": "clip", "pool": "cpu"}
    got = [c for c in recorded(metrics, calls) if c[0] in ("texts", "images")]
    assert got == [("images", 5, tags), ("texts", 1, other), ("images", 2, other)]


def test_requests_are_summed_per_label_set_and_every_latency_kept():
    from blitz.ingress.service import RequestRecord

    metrics, calls = fake_metrics()
    for seconds in (0.1, 0.2, 0.3):
        metrics.observe_request(RequestRecord("/embed", "minilm", "cpu", texts=2, tokens=9),
                                200, seconds)
    tags = {"route": "/embed", "model": "minilm", "pool": "cpu"}
    assert recorded(metrics, calls) == [
        ("requests", 3, {**tags, "status": "200"}), ("texts", 6, tags), ("tokens", 27, tags),
        *[("request_seconds", s, tags) for s in (0.1, 0.2, 0.3)]]


def test_a_model_call_records_its_texts_and_padding_efficiency():
    metrics, calls = fake_metrics()
    metrics.observe_batch("cpu", 12)
    metrics.observe_padding("cpu", 0.75)
    assert recorded(metrics, calls) == [("batch_texts", 12, {"pool": "cpu"}),
                                        ("padding_efficiency", 0.75, {"pool": "cpu"})]


def test_a_routing_decision_is_counted_with_its_reason():
    metrics, calls = fake_metrics()
    metrics.observe_route("cpu", "cold_gpu")
    assert recorded(metrics, calls) == [("route_decisions", 1, {"pool": "cpu", "reason": "cold_gpu"})]


def test_503s_are_counted_by_reason_from_a_closed_set():
    from blitz.ingress.service import RequestRecord

    metrics, calls = fake_metrics()
    for code in ("overloaded", "timeout", "not_ready", "something_new"):
        metrics.observe_request(RequestRecord("/embed", error=code), 503, 0.01)
    metrics.observe_request(RequestRecord("/embed", error="model_not_found"), 404, 0.01)
    reasons = [tags["reason"] for name, _, tags in recorded(metrics, calls)
               if name == "unavailable_replies"]
    assert reasons == ["overloaded", "timeout", "not_ready", "other"]
    assert all(tags["pool"] == "-" and tags.get("model", "-") == "-"
               for name, _, tags in calls if name != "route_decisions")


def test_waiting_sets_the_gauge_of_its_hop_and_model_to_its_last_value():
    metrics, calls = fake_metrics()
    on_waiting = metrics.waiting("ingress", "cpu", "minilm")
    on_waiting(7)
    on_waiting(0)
    metrics.waiting("pool", "cpu", "minilm")(3)
    tags = {"hop": "ingress", "pool": "cpu", "model": "minilm"}
    assert recorded(metrics, calls) == [("waiting_texts", 0, tags),
                                        ("waiting_texts", 3, {**tags, "hop": "pool"})]


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if "query" in v
              and isinstance(v["query"], dict)]
    assert exprs
    return exprs


def test_every_dashboard_query_names_a_declared_metric_and_groups_by_its_labels():
    declared = declared_metrics()
    known = set(declared) | set(SERVE_METRICS_CHARTED)
    for expr in _queries():
        names = set(EXPORTED.findall(expr))
        assert names and names <= known, (expr, names - known)
        for sample in SAMPLE.findall(expr):  # the suffix fits the kind (_total: a counter)
            name = EXPORTED.fullmatch(sample).group(1)
            if name in declared:
                assert sample in exported_names(name, declared[name][0]), sample
        labels = set().union(*(declared.get(n, ("", ()))[1] for n in names)) | SERVE_LABELS
        for group in GROUPED.findall(expr):
            used = {label.strip() for label in group.split(",")} - {"le"}
            assert used <= labels, (expr, used - labels)


def test_every_metric_is_on_a_panel():
    charted = set().union(*(EXPORTED.findall(expr) for expr in _queries()))
    missing = (set(declared_metrics()) | set(SERVE_METRICS_CHARTED)) - charted
    assert not missing, f"not on any panel of {DASHBOARD.name}: {sorted(missing)}"


def test_the_dashboard_panels_do_not_overlap():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert g["x"] + g["w"] <= 24 and not cells & area, p["title"]
        cells |= area


def test_gpu_memory_is_published_per_pool_device_and_kind():
    metrics, calls = fake_metrics()
    publish = metrics.gpu_memory_publisher("gpu")
    publish("0", "allocated", 123)
    publish("0", "reserved", 4096)
    assert calls == [("gpu_memory", 123, {"pool": "gpu", "device": "0", "kind": "allocated"}),
                     ("gpu_memory", 4096, {"pool": "gpu", "device": "0", "kind": "reserved"})]
