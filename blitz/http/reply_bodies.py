"""The reply bodies: how a result (``blitz.hop_messages``) is written on the wire,
defined once per route. ``blitz.http.responses`` then encodes the body as msgpack, JSON
or raw bytes.

- ``embed_reply``: ``POST /embed``. ``numpy`` layout: ``embeddings`` is the array
  (msgpack-numpy's map on msgpack, nested lists on JSON), ``dtype`` its name
  (``"float32"``). ``portable``: ``embeddings`` is the little-endian bytes and ``dtype``
  numpy's ``dtype.str`` (``"<f4"``), so any msgpack decoder rebuilds the array from
  ``shape``. With ``return_chunks``, ``chunks``: per text its windows' vectors and
  character offsets.
- ``openai_embeddings_reply``: ``POST /v1/embeddings``, OpenAI's list of
  ``{"object": "embedding", "index", "embedding"}`` (floats, or base64 of little-endian
  float32).
- ``rerank_reply``: ``POST /rerank`` and ``/v1/rerank`` (Cohere/Jina's shape): no
  arrays, so the same in either msgpack layout.
- ``embed_all_reply``: ``POST /embed_all``: on JSON Hugging Face TEI's list (per text, per
  token, a list of floats); on msgpack ``{model, embeddings: [array per text], usage}``
  in either array layout.
- ``embed_sparse_reply``: ``POST /embed_sparse``: on JSON TEI's list, per text its
  ``{index, value}`` entries in vocabulary order; on msgpack ``{model, dimension,
  embeddings: [{indices, values}], usage}`` with int32 and float32 arrays in either
  layout.
- ``similarity_reply``: ``POST /similarity``, TEI's: one cosine per sentence.
- ``predict_reply``: ``POST /predict``, TEI's: per input a list of ``{score, label}``
  best first (a flat list for a one-input request); ``classify_reply``: ``POST
  /classify``, Infinity's ``{object: "classify", data, model, usage, id, created}``.
- ``tokenize_reply``, ``decode_reply``: ``POST /tokenize`` and ``/decode``, Hugging Face
  TEI's shapes: a list of lists of ``{id, text, special, start, stop}``, a list of texts.

The peers' shapes of the shared routes (docs/compatibility.md says which request gets
which):
- ``tei_embed_reply``: TEI's ``POST /embed``, a bare ``[[float]]``;
  ``tei_rerank_reply``: TEI's ``POST /rerank``, ``[{index, text?, score}]`` best first.
- ``infinity_rerank_reply``: Infinity's ``POST /rerank``, ``{object: "rerank", results:
  [{relevance_score, index, document?: str}], model, usage, id, created}``;
  ``infinity_model``: an entry of Infinity's ``GET /models``.
- ``cohere_embed_reply``, ``cohere_rerank_reply``: Cohere's ``/v1`` and ``/v2`` embed
  and rerank (``id``, ``meta.billed_units``; embeddings by type, or v1's bare floats).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from blitz import codecs
from blitz.codecs import ArrayLayout
from blitz.hop_messages import (
    ClassifyResult,
    DecodeResult,
    EmbedResult,
    RerankHit,
    RerankResult,
    SimilarityResult,
    SparseResult,
    TokenEmbeddingsResult,
    TokenizeResult,
    Usage,
)
from blitz.http.long_inputs import chunks_body
from blitz.settings.kinds import KINDS


def usage_body(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens}


def embed_reply(result: EmbedResult, layout: ArrayLayout | None = "numpy") -> dict[str, Any]:
    """``layout`` None: JSON (as numpy's, nested lists); with ``return_chunks``, ``chunks``
    (``blitz.http.long_inputs.chunks_body``) beside the texts' vectors."""
    emb = result.embeddings
    body: dict[str, Any]
    if layout == "portable":
        data, shape, dtype = codecs.portable_array(emb)
        body = {"model": result.model, "embeddings": data, "shape": shape, "dtype": dtype,
                "usage": usage_body(result.usage)}
    else:
        body = {"model": result.model, "embeddings": emb, "shape": list(emb.shape),
                "dtype": str(emb.dtype), "usage": usage_body(result.usage)}
    if result.chunks is not None:
        body["chunks"] = chunks_body(result.chunks, layout)
    return body


def openai_embeddings_reply(result: EmbedResult,
                            encoding_format: Literal["float", "base64"]) -> dict[str, Any]:
    rows = result.embeddings
    if encoding_format == "base64":
        data = [{"object": "embedding", "index": i, "embedding": codecs.to_base64(row)}
                for i, row in enumerate(rows)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row}
                for i, row in enumerate(rows)]
    return {"object": "list", "data": data, "model": result.model,
            "usage": usage_body(result.usage)}


def rerank_hit(hit: RerankHit) -> dict[str, Any]:
    out: dict[str, Any] = {"index": hit.index, "relevance_score": hit.relevance_score}
    if hit.document is not None:
        out["document"] = {"text": hit.document}
    return out


def rerank_reply(result: RerankResult, request_id: str | None = None) -> dict[str, Any]:
    """Blitz's, Cohere's v1 and Jina's rerank reply (``id`` and ``meta`` as Cohere's)."""
    return {"model": result.model, "results": [rerank_hit(h) for h in result.results],
            "usage": usage_body(result.usage), "id": request_id,
            "meta": cohere_meta("1", {"search_units": 1})}


def tei_embed_reply(result: EmbedResult) -> np.ndarray:
    """TEI's ``[[float]]``: the array itself (JSON writes it from its buffer)."""
    return result.embeddings


def tei_rerank_reply(result: RerankResult) -> list[dict[str, Any]]:
    out = []
    for hit in result.results:
        rank: dict[str, Any] = {"index": hit.index}
        if hit.document is not None:
            rank["text"] = hit.document
        rank["score"] = hit.relevance_score
        out.append(rank)
    return out


def infinity_rerank_reply(result: RerankResult, request_id: str,
                          created: int) -> dict[str, Any]:
    return {"object": "rerank",
            "results": [{"relevance_score": h.relevance_score, "index": h.index,
                         **({"document": h.document} if h.document is not None else {})}
                        for h in result.results],
            "model": result.model, "usage": usage_body(result.usage), "id": request_id,
            "created": created}


def cohere_meta(version: str, billed: dict[str, int]) -> dict[str, Any]:
    return {"api_version": {"version": version}, "billed_units": billed}


def cohere_rerank_reply(result: RerankResult, request_id: str) -> dict[str, Any]:
    """Cohere's v2 rerank: ``{id, results: [{index, relevance_score}], meta}``."""
    return {"id": request_id,
            "results": [{"index": h.index, "relevance_score": h.relevance_score,
                         **({"document": {"text": h.document}}
                            if h.document is not None else {})}
                        for h in result.results],
            "meta": cohere_meta("2", {"search_units": 1})}


def cohere_embed_reply(by_type: dict[str, np.ndarray | list[str]] | np.ndarray,
                       texts: list[str], request_id: str, tokens: int,
                       version: str) -> dict[str, Any]:
    """Cohere's embed reply: ``by_type`` maps each asked type (float, int8, uint8, binary,
    ubinary: arrays; base64: strings) to its rows (``embeddings_by_type``); a bare array is
    v1's ``embeddings_floats``."""
    floats = isinstance(by_type, np.ndarray)
    return {"id": request_id, "embeddings": by_type, "texts": texts,
            "meta": cohere_meta(version, {"input_tokens": tokens}),
            "response_type": "embeddings_floats" if floats else "embeddings_by_type"}


# Infinity's capability names, by Blitz's model kind (its row's ``infinity``)
_CAPABILITIES = {name: list(row.infinity) for name, row in KINDS.items()}


def infinity_model(described: dict[str, Any], created: int) -> dict[str, Any]:
    """A ``GET /models`` entry: Blitz's description (``status.describe_models``) with
    Infinity's fields first (its ``owned_by`` is the enum ``"infinity"``: left out)."""
    return {"id": described["id"], "object": "model", "created": created,
            "backend": described.get("cpu_backend") or "",
            "capabilities": _CAPABILITIES.get(described.get("kind", ""), []), "stats": {},
            **described}


def tokenize_reply(result: TokenizeResult) -> list[list[dict[str, Any]]]:
    return [[{"id": t.id, "text": t.text, "special": t.special, "start": t.start,
              "stop": t.stop} for t in row] for row in result.tokens]


def decode_reply(result: DecodeResult) -> list[str]:
    return result.texts


def embed_all_reply(result: TokenEmbeddingsResult,
                    layout: ArrayLayout | None) -> list[np.ndarray] | dict[str, Any]:
    """``layout`` None: JSON, TEI's bare list; else the msgpack map in that layout."""
    if layout is None:
        return result.embeddings
    if layout == "portable":
        arrays: list[Any] = []
        for rows in result.embeddings:
            data, shape, dtype = codecs.portable_array(rows)
            arrays.append({"data": data, "shape": shape, "dtype": dtype})
    else:
        arrays = result.embeddings
    return {"model": result.model, "embeddings": arrays, "usage": usage_body(result.usage)}


def predictions(result: ClassifyResult) -> list[list[dict[str, Any]]]:
    return [[{"score": p.score, "label": p.label} for p in row] for row in result.predictions]


def predict_reply(result: ClassifyResult, single: bool) -> list[Any]:
    rows = predictions(result)
    return rows[0] if single else rows


def classify_reply(result: ClassifyResult, request_id: str, created: int) -> dict[str, Any]:
    return {"object": "classify", "data": predictions(result), "model": result.model,
            "usage": usage_body(result.usage), "id": request_id, "created": created}


def embed_sparse_reply(result: SparseResult,
                       layout: ArrayLayout | None) -> list[Any] | dict[str, Any]:
    """``layout`` None: JSON, TEI's bare list; else the msgpack map in that layout."""
    if layout is None:
        return [[{"index": int(i), "value": float(v)}
                 for i, v in zip(e.indices.tolist(), e.values.tolist(), strict=True)]
                for e in result.embeddings]
    vectors: list[dict[str, Any]] = []
    for e in result.embeddings:
        if layout == "portable":
            vectors.append({name: dict(zip(("data", "shape", "dtype"),
                                           codecs.portable_array(array), strict=True))
                            for name, array in (("indices", e.indices), ("values", e.values))})
        else:
            vectors.append({"indices": e.indices, "values": e.values})
    return {"model": result.model, "dimension": result.dimension, "embeddings": vectors,
            "usage": usage_body(result.usage)}


def similarity_reply(result: SimilarityResult) -> list[float]:
    return result.scores
