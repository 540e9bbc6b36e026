"""The route table (``blitz.http.routes.table``) is the one declaration of the HTTP API:
the router, the OpenAPI document, the handle methods and the Python client agree with it."""

from __future__ import annotations

import inspect

import httpx
import numpy as np
import pytest
from pydantic import AliasChoices, BaseModel

from blitz import codecs
from blitz.client import AsyncClient, Client
from blitz.http.admin import PREFIX as ADMIN
from blitz.http.api import HttpApi
from blitz.http.routes.table import ROUTES, RouteSpec
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from deployments.handle_methods import HANDLE_METHODS, HandleMethods

TABLE = {(route.method, route.path): route for route in ROUTES}


@pytest.fixture(scope="module")
def api() -> HttpApi:
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:16"}]})
    return HttpApi(EmbeddingService(settings, ReplicaDispatcher(settings)))


def test_every_route_is_declared_once():
    assert len(TABLE) == len(ROUTES)


def test_the_router_serves_the_table_in_its_order(api):
    router = api.app.app
    served = [(method, route.path) for route in router.routes
              for method in sorted(route.methods or ()) if method != "HEAD"
              and not route.path.startswith(ADMIN)]
    assert served == [(r.method, r.path) for r in ROUTES if not r.aside] + \
        [(r.method, r.path) for r in ROUTES if r.aside]
    # the API's own routes (measured under their path) are the table's but the asides
    assert [r.path for r in api.routes] == [r.path for r in ROUTES if not r.aside]


def test_the_openapi_document_describes_the_table(api):
    doc = api._openapi
    described = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert described == set(TABLE)
    for (method, path), route in TABLE.items():
        op = doc["paths"][path][method.lower()]
        assert op["summary"] == route.summary
        assert op["responses"]["200"]["description"] == route.reply
        assert list(op["responses"]["200"]["content"]) == list(route.formats)
        assert ("requestBody" in op) == (route.body is not None or route.upload)
        assert (op.get("security") == []) == route.public


def test_the_handle_offers_the_service_calls_of_the_table():
    calls = {function.__name__: (holder, function) for route in ROUTES
             for holder, function in (*route.calls,
                                      *(c for v in route.variants for c in v.calls))}
    assert HANDLE_METHODS == calls
    assert set(calls) == {"embed", "rerank", "embed_all", "embed_sparse", "embed_hybrid",
                          "similarity", "classify", "tokenize", "decode", "info",
                          "embed_images", "rerank_images", "similarity_images",
                          "embed_parts", "rerank_parts", "embed_multi", "embed_late_chunks",
                          "rerank_pages", "upload", "list_files", "get_file", "delete_file",
                          "file_content", "create_batch", "list_batches", "get_batch",
                          "cancel_batch"}
    for name in calls:
        assert callable(getattr(HandleMethods, name)), name


def _names(model: type[BaseModel]) -> set[str]:
    """Every name a body's field takes (its aliases too)."""
    names = set()
    for name, field in model.model_fields.items():
        names.add(name)
        if isinstance(field.validation_alias, AliasChoices):
            names.update(c for c in field.validation_alias.choices if isinstance(c, str))
    return names


SAMPLES = {"texts": ["a"], "images": [b"png"], "parts": [["a", {"image": b"png"}]], "query": "q", "documents": ["d"],
           "model": "m", "normalize": True, "truncate": True, "dimensions": 4,
           "dtype": "int8", "prompt_name": "query", "instruction": "i",
           "long_inputs": "chunk", "priority": "low", "top_n": 1, "return_documents": True,
           "input_type": "document", "pool_factor": 2, "muvera": True, "pooling": "mean"}


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(cls).items()
            if inspect.isfunction(member) and not name.startswith("_")
            and name not in ("close", "aclose")}


def test_the_client_twins_offer_the_same_calls():
    sync, not_sync = _public_methods(Client), _public_methods(AsyncClient)
    assert sync.keys() == not_sync.keys()
    for name, signature in sync.items():
        assert [p.name for p in signature.parameters.values()] == \
            [p.name for p in not_sync[name].parameters.values()], name


def test_every_client_call_is_a_route_of_the_table_with_its_body_fields():
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, content=codecs.pack({
            "embeddings": np.zeros((1, 2), np.float32), "chunks": [], "data": []}),
            headers={"content-type": "application/msgpack"})

    client = Client("http://blitz", transport=httpx.MockTransport(answer))
    for name, signature in _public_methods(Client).items():
        arguments = {p: SAMPLES[p] for p in list(signature.parameters)[1:]}
        getattr(client, name)(**arguments)
        request = sent.pop()
        route: RouteSpec = TABLE[(request.method, request.url.path)]
        if route.body is None:
            assert not request.content, name
            continue
        body = codecs.unpack(request.content)
        models = [route.body, *(v.body for v in route.variants)]
        fits = [m for m in models if set(body) <= _names(m)]
        assert fits, (name, sorted(body), [m.__name__ for m in models])
        # each option the client offers is sent as the body's field of that name
        assert set(arguments) <= set(body), name
