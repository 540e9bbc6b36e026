"""Property-based tests of the request parsers (blitz/http/bodies.py) on strangers' bodies.

Whatever a decoded body holds, ``parse`` returns a request or raises a ``BlitzError``
with a short message, and its cost grows linearly with the body.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitz.errors import BlitzError
from blitz.http.bodies import (
    ClassifyRequest,
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    EmbedSparseRequest,
    OpenAIEmbeddingRequest,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    TokenizeRequest,
)
from blitz.http.routes.blitz_api import EmbedHybridRequest
from blitz.http.routes.cohere import CohereEmbedRequest, CohereRerankRequest
from blitz.http.routes.images import EmbedImagesRequest, OpenAIImagesRequest, RerankImagesRequest
from blitz.images.inputs import image_bytes
from blitz.settings.config import Limits
from blitz.settings.images import ImageSettings
from tests.unit.test_fuzz_codecs import MAX_RATIO, cost_ratio

LIMITS = Limits(max_texts_per_request=8, max_token_ids_per_request=20)
SERVER_LIMITS = Limits()

# what msgpack or JSON decoding can hand a parser, numpy arrays (msgpack-numpy) included
SCALARS = (st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats()
           | st.text(max_size=10) | st.binary(max_size=6)
           | st.sampled_from([np.zeros(3, np.float32), np.arange(4), np.array(7)]))
VALUES = st.recursive(
    SCALARS,
    lambda kids: (st.lists(kids, max_size=10)
                  | st.dictionaries(st.text(max_size=6) | st.binary(max_size=4), kids,
                                    max_size=4)
                  | st.lists(kids, max_size=4).map(lambda docs: [{"text": d} for d in docs])),
    max_leaves=25)
FIELDS = ["texts", "inputs", "input", "model", "normalize", "truncate", "dimensions", "dtype",
          "prompt_name", "layout", "encoding_format", "user", "query", "documents", "top_n",
          "return_documents", "ids", "add_special_tokens", "skip_special_tokens",
          "return_offsets", "offsets", "raw_scores", "top_k", "input_type", "embedding_types",
          "output_dimension", "truncation_direction", "return_text", "modality", "outputs",
          "instruction", "truncation_side", "long_inputs", "return_chunks", "priority",
          "images"]
# the values each field takes, and values it refuses, in lists of every shape
FIELD_VALUES = (VALUES | st.lists(st.text(max_size=4), max_size=12)
                | st.lists(st.integers(-3, 2**40) | st.booleans(), max_size=25)
                | st.lists(st.lists(st.integers(-3, 50), max_size=6), max_size=10)
                | st.sampled_from(["float32", "int8", "binary", "base64", "float", "portable",
                                   "numpy", 1, 0, True, -1, "END", "NONE", "START", "right",
                                   "left", "search_query", "text", "image", "dense",
                                   "sparse", "colbert", ["dense", "colbert"], [], "chunk",
                                   "truncate", "error", "high", "low", "normal"]))
BODIES = (st.dictionaries(st.sampled_from(FIELDS), FIELD_VALUES, max_size=6)
          | st.dictionaries(st.text(max_size=8), VALUES, max_size=4) | VALUES)


def parsed_or_refused(parse: Any, body: Any, limits: Limits) -> Any:
    try:
        return parse(body, limits)
    except BlitzError as exc:
        assert len(exc.message) < 400  # a short message, not the body echoed back
        return None


@given(BODIES, st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_an_embed_request_or_refused(body, limits):
    request = parsed_or_refused(EmbedRequest.parse, body, limits)
    if request is not None:  # texts, or (TEI's inputs) token ids
        texts, token_ids = request.texts_or_token_ids()
        if texts is not None:
            assert token_ids is None and all(type(t) is str for t in texts)
        else:
            assert all(type(t) is int for row in token_ids for t in row)


@given(BODIES, st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_an_openai_request_or_refused(body, limits):
    request = parsed_or_refused(OpenAIEmbeddingRequest.parse, body, limits)
    if request is not None:
        texts, token_ids = request.texts_or_token_ids()
        if texts is not None:
            assert token_ids is None and all(type(t) is str for t in texts)
        else:
            assert all(type(t) is int for row in token_ids for t in row)


@given(BODIES | st.fixed_dictionaries({"images": FIELD_VALUES | st.lists(
    st.binary(max_size=40) | st.sampled_from(["data:image/png;base64,iVBORw0KGgo=",
                                              "data:x", "http://x/y.png", "R0lGODlh"]),
    max_size=6)}), st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_an_image_request_or_refused_and_its_images_bytes_or_a_4xx(body, limits):
    import asyncio

    for parse in (EmbedImagesRequest.parse, OpenAIImagesRequest.parse,
                  RerankImagesRequest.parse):
        request = parsed_or_refused(parse, body, limits)
        if request is None:
            continue
        items = getattr(request, "images", None) or getattr(request, "input", None)
        try:
            got = asyncio.run(image_bytes(items if isinstance(items, list) else [items],
                                          ImageSettings(max_bytes=64)))
        except BlitzError as exc:
            assert 400 <= exc.status < 500 and len(exc.message) < 400
        else:
            assert all(type(data) is bytes for data in got)


@given(BODIES, st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_a_rerank_request_or_refused(body, limits):
    request = parsed_or_refused(RerankRequest.parse, body, limits)
    if request is not None:
        assert type(request.query) is str and all(type(d) is str for d in request.documents)


@given(BODIES, st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_a_cohere_request_or_refused(body, limits):
    request = parsed_or_refused(CohereEmbedRequest.parse, body, limits)
    if request is not None:
        assert request.texts and all(type(t) is str for t in request.texts)
        assert request.truncate in ("END", "NONE")
    request = parsed_or_refused(CohereRerankRequest.parse, body, limits)
    if request is not None:
        assert type(request.query) is str and all(type(d) is str for d in request.documents)


@given(BODIES, st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_a_tokenize_decode_or_text_request_or_refused(body, limits):
    for parse in (TokenizeRequest.parse, EmbedAllRequest.parse, EmbedSparseRequest.parse):
        request = parsed_or_refused(parse, body, limits)
        if request is not None:
            texts = request.texts
            assert isinstance(texts, str) or all(type(t) is str for t in texts)
    request = parsed_or_refused(EmbedHybridRequest.parse, body, limits)
    if request is not None:
        texts = request.texts
        assert isinstance(texts, str) or all(type(t) is str for t in texts)
        assert request.outputs and set(request.outputs) <= {"dense", "sparse", "colbert"}
        assert len(set(request.outputs)) == len(request.outputs)
    request = parsed_or_refused(DecodeRequest.parse, body, limits)
    if request is not None:
        rows = request.ids if request.ids and isinstance(request.ids[0], list) else [request.ids]
        assert all(type(t) is int for row in rows for t in row)


@given(BODIES, st.sampled_from([LIMITS, SERVER_LIMITS, None]))
def test_any_body_is_a_predict_or_classify_request_or_refused(body, limits):
    request = parsed_or_refused(PredictRequest.parse, body, limits)
    if request is not None:
        items, _ = request.batch()
        assert items and all(1 <= len(i) <= 2 and all(type(t) is str for t in i)
                             for i in items)
    request = parsed_or_refused(ClassifyRequest.parse, body, limits)
    if request is not None:
        assert isinstance(request.input, str) or all(type(t) is str for t in request.input)
    nested = {"inputs": {"source_sentence": body, "sentences": body}, "model": "m"}
    for candidate in (body, nested):
        request = parsed_or_refused(SimilarityRequest.parse, candidate, limits)
        if request is not None:
            assert type(request.inputs.source_sentence) is str
            assert all(type(t) is str for t in request.inputs.sentences)


def _parse(parse: Any) -> Any:
    return lambda body: parsed_or_refused(parse, body, SERVER_LIMITS)


# (body at size n, parser, n); a body over a limit is refused after one len()
FAMILIES: dict[str, tuple[Any, Any, int]] = {
    "embed: texts": (lambda n: {"texts": ["a"] * n}, _parse(EmbedRequest.parse), 1_000),
    "embed: texts over the limit": (lambda n: {"texts": ["a"] * n},
                                    _parse(EmbedRequest.parse), 200_000),
    "openai: token ids": (lambda n: {"input": list(range(n))},
                          _parse(OpenAIEmbeddingRequest.parse), 20_000),
    "openai: token ids, bad last": (lambda n: {"input": [*range(n), "x"]},
                                    _parse(OpenAIEmbeddingRequest.parse), 20_000),
    "openai: token-id rows": (lambda n: {"input": [list(range(n // 1000))] * 1000},
                              _parse(OpenAIEmbeddingRequest.parse), 50_000),
    "openai: many keys": (lambda n: {f"key-{i:07}": 0 for i in range(n)} | {"input": "a"},
                          _parse(OpenAIEmbeddingRequest.parse), 20_000),
    "rerank: document objects": (lambda n: {"query": "q", "documents": [{"text": "d"}] * n},
                                 _parse(RerankRequest.parse), 1_000),
    "decode: ids": (lambda n: {"ids": list(range(n))}, _parse(DecodeRequest.parse), 20_000),
    "decode: ids, bad last": (lambda n: {"ids": [*range(n), True]},
                              _parse(DecodeRequest.parse), 20_000),
    "decode: id rows": (lambda n: {"ids": [list(range(n // 1000))] * 1000},
                        _parse(DecodeRequest.parse), 50_000),
    "tokenize: texts": (lambda n: {"inputs": ["a"] * n}, _parse(TokenizeRequest.parse), 1_000),
    "predict: pairs": (lambda n: {"inputs": [["q", "d"]] * n}, _parse(PredictRequest.parse),
                       1_000),
    "predict: pairs over the limit": (lambda n: {"inputs": [["q", "d"]] * n},
                                      _parse(PredictRequest.parse), 200_000),
    "classify: texts": (lambda n: {"input": ["a"] * n}, _parse(ClassifyRequest.parse), 1_000),
    "similarity: sentences": (lambda n: {"inputs": {"source_sentence": "a",
                                                    "sentences": ["b"] * n}},
                              _parse(SimilarityRequest.parse), 1_000),
    "similarity: over the limit": (lambda n: {"inputs": {"source_sentence": "a",
                                                         "sentences": ["b"] * n}},
                                   _parse(SimilarityRequest.parse), 200_000),
    "embed_sparse: texts": (lambda n: {"inputs": ["a"] * n}, _parse(EmbedSparseRequest.parse),
                            1_000),
    "embed_hybrid: outputs": (lambda n: {"inputs": "a", "outputs": ["dense", "colbert"] * n},
                              _parse(EmbedHybridRequest.parse), 20_000),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parse_cost_grows_linearly(family):
    build, call, n = FAMILIES[family]
    assert cost_ratio(build, call, n) <= MAX_RATIO
