"""``GET /openapi.json`` and ``GET /docs`` in process (no Ray): the document is valid
OpenAPI 3.1 and names every route; each request schema takes a real body that its route
answers 2xx, in a format the document names; the page is self-contained and public."""

from __future__ import annotations

import httpx
import pytest
from starlette.routing import Route

from blitz import codecs
from blitz.http import openapi
from blitz.http.api import HttpApi
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, api_for
from tests.tiny_hybrid import build_tiny_hybrid
from tests.tiny_models import build_tiny_classifier, build_tiny_splade, minilm_dir
from tests.tiny_vision import build_tiny_dual_encoder
from tests.tiny_vl import build_tiny_vl

MSGPACK = "application/msgpack"
TEXTS = ["a small text", "another, longer text"]
RERANK = {"query": "a question", "documents": TEXTS, "model": "ce"}
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP"
       "kEpFjYGBgYmBgYGBgAAAC5gBAXKUgWwAAAABJRU5ErkJggg==")  # 2 x 2 RGB
# one real body per POST route, as a client sends it
EXAMPLES: dict[str, dict] = {
    "/embed": {"texts": TEXTS, "normalize": True},
    "/v1/embeddings": {"input": TEXTS, "encoding_format": "float"},
    "/embeddings": {"input": TEXTS[0]},
    "/rerank": {**RERANK, "return_documents": True},
    "/v1/rerank": RERANK,
    "/v2/rerank": RERANK,
    "/": {"inputs": TEXTS[0]},
    "/invocations": {"inputs": TEXTS},
    "/v1/embed": {"texts": TEXTS, "input_type": "search_query"},
    "/v2/embed": {"texts": TEXTS, "embedding_types": ["float", "int8"]},
    "/embed_all": {"inputs": TEXTS, "model": "minilm"},
    "/embed_sparse": {"inputs": TEXTS, "model": "splade"},
    "/embed_hybrid": {"inputs": TEXTS, "model": "m3", "outputs": ["dense", "sparse"]},
    "/similarity": {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}},
    "/predict": {"inputs": TEXTS[0], "model": "cls"},
    "/classify": {"input": TEXTS, "model": "cls"},
    "/tokenize": {"inputs": TEXTS, "model": "minilm"},
    "/decode": {"ids": [[101, 7592, 102]], "model": "minilm"},
}
EXAMPLES["/embeddings_image"] = {"input": [PNG], "model": "clip"}
EXAMPLES["/v1/multimodalembeddings"] = {
    "model": "vl", "inputs": [{"content": [{"type": "text", "text": TEXTS[0]},
                                           {"type": "image_base64", "image_base64": PNG}]}]}
EXAMPLES["/embed_multivector"] = {"texts": TEXTS, "model": "mv", "pool_factor": 2}
EXAMPLES["/v1/contextualizedembeddings"] = {"inputs": [TEXTS, [TEXTS[0]]], "model": "minilm",
                                            "input_type": "document"}
BATCH_API = ("/v1/files", "/v1/batches")  # files and batches: tests/unit/test_batch_api.py
TEI_EXAMPLES = {"/embed": {"inputs": TEXTS}, "/rerank": {**RERANK, "texts": TEXTS},
                "/tokenize": {"texts": TEXTS[0], "model": "minilm"}}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("openapi")
    return [{"id": "fake", "source": "fake:16"},
            {"id": "ce", "source": "fake:4", "kind": "cross-encoder"},
            {"id": "cls", "source": str(build_tiny_classifier(root / "cls", seed=3)),
             "kind": "classifier", "cpu_backend": "torch"},
            {"id": "splade", "source": str(build_tiny_splade(root / "splade", seed=4)),
             "kind": "sparse"},
            {"id": "m3", "source": str(build_tiny_hybrid(root / "m3", seed=4)),
             "kind": "hybrid"},
            {"id": "minilm", "source": str(minilm_dir()), "cpu_backend": "torch"},
            {"id": "clip", "source": str(build_tiny_dual_encoder(root / "clip", "clip")),
             "kind": "dual-encoder"},
            {"id": "vl", "source": str(build_tiny_vl(root / "vl", "qwen3_vl")),
             "kind": "vl-embedding"},
            {"id": "mv", "source": "fake:16", "kind": "multi-vector"}]


def make_api(models: list[dict], keys: list[str] | None = None) -> HttpApi:
    settings = BlitzSettings.from_args({"models": models,
                                        **({"auth": {"api_keys": keys}} if keys else {})})
    return api_for(settings)


def client_of(api: HttpApi) -> httpx.AsyncClient:
    return api_client(api)


def operations(doc: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}


def validator(doc: dict, ref: str):
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator({"$ref": ref, "components": doc["components"]})


async def test_the_document_is_valid_openapi_and_names_every_route(models):
    api = make_api(models[:2])
    async with client_of(api) as client:
        r = await client.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    spec = pytest.importorskip("openapi_spec_validator")
    spec.validate(doc)
    routes = {(m, route.path) for route in api.routes for m in route.methods if m != "HEAD"}
    assert routes <= operations(doc)
    assert {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/")} <= operations(doc)
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert op["summary"] and op["responses"]["200"]["description"], path


def test_a_route_with_no_entry_fails_the_build():
    async def new_route(request):  # pragma: no cover - never called
        raise AssertionError
    with pytest.raises(LookupError, match="POST /new"):
        openapi.document([Route("/new", new_route, methods=["POST"])])


def test_aliases_appear_and_a_required_field_takes_any_of_its_names(models):
    doc = make_api(models[:2])._openapi
    schemas = doc["components"]["schemas"]
    assert {"texts", "inputs"} <= set(schemas["EmbedRequest"]["properties"])
    assert {"documents", "texts", "return_text"} <= set(schemas["RerankRequest"]["properties"])
    embed = validator(doc, "#/components/schemas/EmbedRequest")
    assert embed.is_valid({"inputs": "x"}) and embed.is_valid({"texts": ["x"]})
    assert not embed.is_valid({"model": "fake"})  # neither name: refused
    assert not embed.is_valid({"texts": "x", "truncate": 1})  # strict booleans


async def test_every_documented_route_answers_as_documented(models):
    api = make_api(models)
    doc = api._openapi
    batch_api = {(m, p) for m, p in operations(doc) if p.startswith(BATCH_API)}
    posts = {path for method, path in operations(doc) - batch_api if method == "POST"}
    assert posts == set(EXAMPLES)
    async with client_of(api) as client:
        for method, path in sorted(operations(doc) - batch_api):  # test_batch_api.py's
            op = doc["paths"][path][method.lower()]
            formats = set(op["responses"]["200"]["content"])
            bodies = [EXAMPLES[path], *([TEI_EXAMPLES[path]] if path in TEI_EXAMPLES else [])] \
                if method == "POST" else [None]
            for body in bodies:
                if body is not None:
                    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                    errors = list(validator(doc, ref).iter_errors(body))
                    assert not errors, (path, body, errors[0].message if errors else None)
                r = await client.request(method, path, json=body)
                assert 200 <= r.status_code < 300, (method, path, r.text)
                assert r.headers["content-type"].split(";")[0] in formats, (path, r.headers)
                if MSGPACK in formats:  # asked for, msgpack is what comes
                    m = await client.request(method, path, json=body,
                                             headers={"accept": MSGPACK})
                    assert m.status_code == 200, (path, m.text)
                    assert m.headers["content-type"] == MSGPACK, path
                    codecs.unpack(m.content)


async def test_the_page_is_self_contained_html_naming_every_route(models):
    api = make_api(models[:2])
    async with client_of(api) as client:
        r = await client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    for method, path in operations(api._openapi):
        assert f"<span class=\"m\">{method}</span> <code>{path}</code>" in page
    assert "<script" not in page and "<link" not in page and "src=" not in page
    assert "http://" not in page and "https://" not in page
    assert "EmbedRequest" not in page or "inputs" in page  # the request fields are listed
    assert "<code>inputs</code>" in page and "<code>query</code>" in page


def test_the_page_escapes_what_it_shows():
    doc = {"info": {"title": "<b>x</b>", "description": "a & b"}, "paths": {"/<p>": {
        "get": {"summary": "<script>", "responses": {"200": {
            "description": "\"q\"", "content": {"application/json": {}}}}}}},
        "components": {"schemas": {}}}
    page = openapi.docs_page(doc)
    assert "<script>" not in page and "<b>x</b>" not in page and "/<p>" not in page
    assert "&lt;script&gt;" in page and "a &amp; b" in page


async def test_the_description_is_public_while_keyed_routes_take_a_key(models):
    api = make_api(models[:2], keys=["k1"])
    async with client_of(api) as client:
        assert (await client.get("/openapi.json")).status_code == 200
        assert (await client.get("/docs")).status_code == 200
        for method, path in operations(api._openapi):  # as each route's security says
            public = api._openapi["paths"][path][method.lower()].get("security") == []
            r = await client.request(method, path, json={} if method == "POST" else None)
            assert (r.status_code != 401) == public, (method, path, r.status_code)
