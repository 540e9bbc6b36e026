"""A model kind is declared once (``blitz.settings.kinds.KINDS``): every kind has an encoder
that declares the row's capabilities, an encoder answers exactly what it declares and
refuses the rest in the one refusal's words, the openers, backends and costs follow the
rows, a service a kind does not serve is refused as before, and no module outside the
table tests a model's kind against a kind's name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import get_args

import pytest

from blitz.encoders.base import METHODS, Encoder, refusal
from blitz.encoders.fake import FakeEncoder
from blitz.errors import InvalidValue
from blitz.ingress.limits import KIND_COSTS
from blitz.loading.opening import OPENERS
from blitz.settings.config import BlitzSettings
from blitz.settings.kinds import CAPABILITIES, KINDS, SERVICES, Kind, serving
from blitz.settings.registry import ModelSpec
from tests.api_client import api_client
from tests.error_body import error_body

REPO = Path(__file__).resolve().parents[2]


def _encoder_class(dotted: str) -> type[Encoder]:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_kind_literal_names_the_rows_in_order():
    assert get_args(Kind) == tuple(KINDS)
    assert all(row.name == name for name, row in KINDS.items())
    assert KIND_COSTS == {name: row.cost for name, row in KINDS.items()}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_has_an_encoder_that_declares_its_capabilities(kind):
    row = KINDS[kind]
    cls = _encoder_class(row.encoder)
    assert issubclass(cls, Encoder) and cls.kind == kind
    assert cls.capabilities == row.capabilities
    assert set(row.capabilities) <= set(CAPABILITIES) and set(row.serves) <= set(SERVICES)


def _every_encoder_class() -> set[type[Encoder]]:
    for row in KINDS.values():
        _encoder_class(row.encoder)
    importlib.import_module("blitz.images.onnx_dual")
    importlib.import_module("blitz.encoders.onnx_native")
    importlib.import_module("blitz.encoders.sentence_transformer")
    found: set[type[Encoder]] = set()
    todo = [Encoder]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("blitz.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_an_encoder_answers_what_it_declares_and_refuses_the_rest_alike():
    classes = _every_encoder_class() - {FakeEncoder}  # the fake plays every kind
    assert len(classes) >= 10
    for cls in classes:
        assert set(cls.capabilities) <= set(CAPABILITIES), cls
        for capability, names in METHODS.items():
            if capability == "score":  # Encoder.score is the cosine of its vectors
                continue
            for name in names:
                inherited = getattr(cls, name) is getattr(Encoder, name)
                assert inherited != (capability in cls.capabilities), (cls, name)


def _bare(cls: type[Encoder], kind: str) -> Encoder:
    """An instance of ``cls`` with no model (an abstract one's methods filled with None)."""
    missing = dict.fromkeys(getattr(cls, "__abstractmethods__", ()), None)
    concrete = type(cls.__name__, (cls,), missing) if missing else cls
    encoder = concrete.__new__(concrete)
    encoder.model_id, encoder.max_seq_length, encoder.kind = "m", 8, kind
    return encoder


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_call_a_kind_lacks_is_refused_with_a_422_naming_the_model(kind):
    encoder = _bare(_encoder_class(KINDS[kind].encoder), kind)
    calls = {"embed_tokens": lambda: encoder.embed_tokens([[1]], normalize=True),
             "embed_all": lambda: encoder.embed_all(["x"]),
             "embed_sparse": lambda: encoder.embed_sparse(["x"]),
             "embed_hybrid": lambda: encoder.embed_hybrid(["x"], ("dense",)),
             "classify": lambda: encoder.classify([["x"]]),
             "embed_images": lambda: encoder.embed_image_bytes([b"x"], normalize=True),
             "embed": lambda: encoder.embed(["x"], normalize=True)}
    for capability, call in calls.items():
        if capability in KINDS[kind].capabilities:
            continue
        with pytest.raises(InvalidValue) as caught:
            call()
        assert caught.value.message == refusal(encoder, capability).message
        assert caught.value.param in ("model", "input")


def test_the_refusals_keep_their_words():
    encoder = _bare(_encoder_class(KINDS["cross-encoder"].encoder), "cross-encoder")
    assert refusal(encoder, "embed").message == (
        "model 'm' is a cross-encoder and cannot embed; use /rerank")
    assert refusal(encoder, "embed_images").message == (
        "model 'm' is a cross-encoder model; images need a dual-encoder (CLIP, SigLIP) or a "
        "vision-language embedder (vl-embedding)")
    sparse = _bare(_encoder_class(KINDS["sparse"].encoder), "sparse")
    assert refusal(sparse, "embed").message == (
        "model 'm' gives sparse embeddings; use /embed_sparse")


def test_a_fake_takes_images_only_where_its_kind_does():
    for kind, row in KINDS.items():
        fake = FakeEncoder("f", 4, kind=kind)
        assert ("embed_images" in fake.capabilities) == ("embed_images" in row.capabilities)


def test_every_kind_opens_on_its_backends_and_the_fake():
    for kind, row in KINDS.items():
        named = {backend for k, backend in OPENERS if k == kind}
        assert named == {*row.backends, "fake"} - {"auto"}, kind


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_spec_runs_on_its_kinds_backends_alone(kind):
    for backend in ("torch", "torch-bf16", "onnx", "onnx-int8", "auto"):
        spec = {"id": "m", "source": "/m", "kind": kind, "cpu_backend": backend}
        if backend in KINDS[kind].backends:
            ModelSpec(**spec)
        else:
            with pytest.raises(ValueError, match="run|auto"):
                ModelSpec(**spec)


ROUTES = {  # service -> (path, body)
    "embed": ("/embed", {"inputs": ["x"]}),
    "embed_all": ("/embed_all", {"inputs": ["x"]}),
    "embed_sparse": ("/embed_sparse", {"inputs": ["x"]}),
    "embed_hybrid": ("/embed_hybrid", {"inputs": ["x"]}),
    "classify": ("/predict", {"inputs": "x"}),
}


@pytest.fixture
async def client():
    settings = BlitzSettings.from_args({"models": [
        {"id": kind, "source": "fake:8", "kind": kind} for kind in KINDS]})
    async with api_client(settings) as c:
        yield c


@pytest.mark.parametrize("service", sorted(ROUTES))
async def test_a_route_serves_the_kinds_that_list_it_and_refuses_the_others(client, service):
    path, body = ROUTES[service]
    for kind in KINDS:
        r = await client.post(path, json={**body, "model": kind})
        refused = f"model {kind!r} is a {kind};"  # the ingress's, before any pool call
        if kind in serving(service):  # type: ignore[arg-type]
            assert r.status_code == 200 or refused not in error_body(r)["message"], (kind, r.text)
        else:
            assert r.status_code == 422 and error_body(r)["param"] == "model", (kind, r.text)
            assert refused in error_body(r)["message"], (kind, r.text)


def _kind_tests(path: Path) -> list[str]:
    """Comparisons of a ``kind`` (a name or an attribute) with a kind's name or names."""
    found = []
    names = set(KINDS)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        is_kind = any(isinstance(s, ast.Name) and s.id == "kind" or isinstance(
            s, ast.Attribute) and s.attr == "kind" for s in sides)
        literals = {c.value for s in sides for c in ast.walk(s)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if is_kind and literals & names:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_module_outside_the_table_tests_a_kind_by_name():
    table = REPO / "blitz" / "settings" / "kinds.py"
    found = [hit for folder in ("blitz", "deployments")
             for path in sorted((REPO / folder).rglob("*.py")) if path != table
             for hit in _kind_tests(path)]
    assert found == []
