"""The local hop (``ingress.pool_hop: auto``): an ingress calls its node's one CPU pool
replica over a Unix socket instead of Serve's handle, with the same answers; with
``pool_hop: serve`` it never does. (A pool replica killed under load, with the hop in
use, is tests/faults/test_replica_kill.py: its fault apps run one replica.)"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from blitz import codecs

MSGPACK = {"content-type": "application/msgpack"}
FOUND_WITHIN_S = 60  # a bound on the poll below, not a timing assertion
TEXTS = [f"sentence {i} about topic {i * 7 % 13}" for i in range(24)]


def _args(model_dir: str, pool_hop: str) -> dict:
    return {"models": [{"id": "tiny-a", "source": model_dir}], "gpu": "off",
            "cpu_pool": {"torch_threads": 1, "workers": 1, "max_batch_size": 8, "deployment": {
                "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}},
            "ingress": {"pool_hop": pool_hop, "deployment": {
                "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}}}


@pytest.fixture(scope="module")
def hop_apps(serve_instance, tiny_models):
    from ray import serve

    from deployments.app import build_app

    names = {"auto": "it-hop-auto", "serve": "it-hop-serve"}
    for pool_hop, name in names.items():
        serve.run(build_app(_args(str(tiny_models["tiny-a"]), pool_hop)), name=name,
                  route_prefix=f"/{name}")
    yield {pool_hop: (serve_instance + f"/{name}", name) for pool_hop, name in names.items()}
    for name in names.values():
        serve.delete(name)


def _embed(base: str, texts: list[str]) -> np.ndarray:
    r = httpx.post(f"{base}/embed", content=codecs.pack({"texts": texts}), headers=MSGPACK,
                   timeout=60)
    assert r.status_code == 200, r.text
    return codecs.unpack(r.content)["embeddings"]


async def _stats(app: str) -> dict:
    from ray import serve

    return await serve.get_deployment_handle("CPUPool", app).stats.remote()


async def test_the_ingress_calls_its_nodes_one_pool_replica_over_the_local_hop(hop_apps):
    base, app = hop_apps["auto"]
    deadline = time.monotonic() + FOUND_WITHIN_S
    while not (await _stats(app))["local_hop_calls"]:  # found in the background
        assert time.monotonic() < deadline, "the ingress never took the local hop"
        _embed(base, TEXTS[:1])
    before = (await _stats(app))["local_hop_calls"]
    over_hop = np.concatenate([_embed(base, [t]) for t in TEXTS])
    assert (await _stats(app))["local_hop_calls"] >= before + len(TEXTS)

    serve_base, serve_app = hop_apps["serve"]
    over_handle = np.concatenate([_embed(serve_base, [t]) for t in TEXTS])
    assert (await _stats(serve_app))["local_hop_calls"] is None  # never asked for
    np.testing.assert_array_equal(over_hop, over_handle)  # one vector per text, either way


async def test_errors_come_back_over_the_local_hop_as_over_the_handle(hop_apps):
    base, app = hop_apps["auto"]
    _embed(base, TEXTS[:1])
    assert (await _stats(app))["local_hop_calls"]
    too_long = httpx.post(f"{base}/embed", json={"texts": ["word " * 5000], "truncate": False},
                          timeout=60)
    assert too_long.status_code == 413, too_long.text
    assert "input 0 has" in too_long.json()["error"]["message"]
