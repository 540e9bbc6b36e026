"""The vector cache on a real app (``ingress.vector_cache_mb``): a repeated text is
answered from the ingress's memory, bit for bit, with its hits in ``server-timing`` and in
the metrics."""

from __future__ import annotations

import httpx
import pytest

from blitz import codecs, timing
from tests.metrics_scrape import metrics_url, scrape_until, total

APP = "it-cache"
MSGPACK = {"content-type": "application/msgpack"}


@pytest.fixture(scope="module")
def cache_app(serve_instance, tiny_models):
    from ray import serve

    from deployments.app import build_app

    small = {"ray_actor_options": {"num_cpus": 0.1},
             "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    serve.run(build_app({
        "models": [{"id": "tiny-a", "source": str(tiny_models["tiny-a"])}],
        "gpu": "off", "ingress": {"vector_cache_mb": 4,
                                  "deployment": {"num_replicas": 1,
                                                 "ray_actor_options": {"num_cpus": 0.1}}},
        "cpu_pool": {"deployment": small, "torch_threads": 1, "max_batch_size": 8}}),
        name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def embed(client: httpx.Client, texts: list[str], **options) -> tuple[bytes, str]:
    r = client.post("/embed", content=codecs.pack({"texts": texts, **options}), headers=MSGPACK)
    assert r.status_code == 200, r.text
    return codecs.unpack(r.content)["embeddings"].tobytes(), r.headers[timing.HEADER]


def test_repeated_texts_are_hits_equal_bit_for_bit_and_counted(cache_app):
    texts = [f"cached text {i}" for i in range(12)]  # more than one pool batch
    with httpx.Client(base_url=cache_app, timeout=60) as client:
        first, header = embed(client, texts)
        assert 'desc="hit 0 of 12"' in header
        again, header = embed(client, texts)
        assert 'desc="hit 12 of 12"' in header and again == first
        assert "model" not in timing.parse_header(header)  # no pool call at all
        mixed, header = embed(client, [texts[3], "a new one", texts[3]])
        assert 'desc="hit 2 of 3"' in header
        row = len(first) // 12
        assert mixed[:row] == first[3 * row:4 * row] == mixed[2 * row:]
        sliced, _ = embed(client, texts[:2], dimensions=8, dtype="int8")
        assert len(sliced) == 2 * 8
        r = client.post("/v1/embeddings", json={"input": texts[:2], "encoding_format": "float"})
        assert r.status_code == 200 and 'desc="hit 2 of 2"' in r.headers[timing.HEADER]

    def counted(samples) -> bool:
        ours = [s for s in samples if s.labels.get("application") == APP]
        return (total(ours, "ray_blitz_vector_cache_texts_total", model="tiny-a",
                      outcome="hit") >= 12 + 2 + 2
                and total(ours, "ray_blitz_vector_cache_texts_total", model="tiny-a",
                          outcome="miss") >= 12 + 1
                and total(ours, "ray_blitz_vector_cache_bytes") > 0)

    scrape_until(metrics_url(), counted)
