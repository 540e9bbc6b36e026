"""API keys on a deployed app: 401 without or with a wrong key, health stays public."""

from __future__ import annotations

import httpx
import pytest

from blitz.client import BlitzHTTPError, Client

KEY = "sk-integration-key"
TINY = {"ray_actor_options": {"num_cpus": 0.1}}  # Serve deployment options


@pytest.fixture(scope="module")
def auth_app(serve_instance):
    from ray import serve

    from deployments.app import build_app

    args = {"models": [{"id": "fake", "source": "fake:8"}], "gpu": "off",
            "auth": {"api_keys": [KEY]},
            "cpu_pool": {"deployment": TINY},
            "ingress": {"deployment": {**TINY, "num_replicas": 1}}}
    serve.run(build_app(args), name="it-auth", route_prefix="/it-auth")
    yield serve_instance + "/it-auth"
    serve.delete("it-auth")


def test_keys_are_checked(auth_app):
    with httpx.Client(base_url=auth_app) as http:
        assert http.get("/health").status_code == 200
        r = http.post("/embed", json={"texts": ["x"]})
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
        r = http.post("/v1/embeddings", json={"input": "x", "model": "fake"},
                      headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid API key"
    with Client(auth_app, api_key=KEY) as client:
        assert client.embed(["x"]).shape == (1, 8)
    with Client(auth_app, api_key="wrong") as client, pytest.raises(BlitzHTTPError) as info:
        client.embed(["x"])
    assert info.value.status == 401
