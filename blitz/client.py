"""HTTP client for Blitz, sync (``Client``) and async (``AsyncClient``).

Both share one implementation: ``_Calls`` builds each request and parses each reply
(no I/O); the two classes only differ in how they send. Replies are msgpack, and
``embed()`` returns a read-only numpy view of the reply bytes (no copy).

    >>> from blitz.client import Client
    >>> Client("http://127.0.0.1:8000").embed(["hello"], model="minilm").shape
    (1, 384)
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
import numpy as np

from blitz import codecs
from blitz.encoders.postprocess import OutputDtype
from blitz.hop_messages import PriorityName, TextChunks

_MSGPACK = codecs.MSGPACK_TYPES[0]
LongInputs = Literal["truncate", "error", "chunk"]


class BlitzHTTPError(Exception):
    """The server answered with an error; ``status``, ``code`` and ``message`` say which."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 request_id: str | None = None):
        super().__init__(f"{status} {code or ''}: {message}".replace(" :", ":"))
        self.status, self.message, self.code, self.request_id = status, message, code, request_id


class _Calls:
    """Requests and reply parsing, without I/O."""

    @staticmethod
    def _post(url: str, body: dict[str, Any], model: str | None) -> dict[str, Any]:
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"content-type": _MSGPACK, "accept": _MSGPACK}
        if model:
            headers["serve_multiplexed_model_id"] = body["model"] = model
        return {"method": "POST", "url": url, "content": codecs.pack(body), "headers": headers}

    @classmethod
    def embed(cls, texts: str | list[str], model: str | None,
              **options: Any) -> dict[str, Any]:
        """``options``: the body's fields (normalize, truncate, dimensions, dtype,
        prompt_name, instruction, long_inputs, return_chunks, priority); None ones are
        left out."""
        return cls._post("/embed", {"texts": texts, **options}, model)

    @classmethod
    def embed_images(cls, images: list[bytes | str], model: str | None,
                     **options: Any) -> dict[str, Any]:
        """Each image its file's bytes (sent as msgpack bytes) or a URL the server may
        fetch; ``options``: normalize, dimensions, dtype, priority."""
        return cls._post("/embed", {"images": images, **options}, model)

    @classmethod
    def embed_parts(cls, parts: list[Any], model: str | None,
                    **options: Any) -> dict[str, Any]:
        """Each document a text, a part or a list of parts (an image as its file's bytes:
        ``{"image": data}``); ``options``: instruction, normalize, dimensions, dtype,
        priority."""
        return cls._post("/embed", {"parts": parts, **options}, model)

    @classmethod
    def embed_multivector(cls, texts: str | list[str] | None, model: str | None,
                          **options: Any) -> dict[str, Any]:
        """``options``: images, input_type, pool_factor, muvera, dtype, truncate,
        priority."""
        return cls._post("/embed_multivector", {"texts": texts, **options}, model)

    @classmethod
    def embed_late_chunks(cls, texts: list[str], model: str | None,
                          **options: Any) -> dict[str, Any]:
        """``texts``: one document's chunks; ``options``: pooling, normalize, dimensions,
        dtype, prompt_name, priority."""
        return cls._post("/embed", {"texts": texts, "late_chunking": True, **options}, model)

    @classmethod
    def rerank_parts(cls, query: Any, documents: list[Any], model: str | None, *,
                     top_n: int | None, instruction: str | None,
                     priority: PriorityName | None) -> dict[str, Any]:
        return cls._post("/rerank", {"query": query, "documents": documents, "top_n": top_n,
                                     "instruction": instruction, "priority": priority}, model)

    @classmethod
    def rerank(cls, query: str, documents: list[str], model: str | None, *,
               top_n: int | None, return_documents: bool | None,
               truncate: bool | None, priority: PriorityName | None) -> dict[str, Any]:
        return cls._post("/rerank", {"query": query, "documents": documents, "top_n": top_n,
                                     "return_documents": return_documents,
                                     "truncate": truncate, "priority": priority}, model)

    @staticmethod
    def models() -> dict[str, Any]:
        return {"method": "GET", "url": "/models"}

    @staticmethod
    def decode(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                error = codecs.loads_json(response.content)["error"]
                message, code = error.get("message", ""), error.get("code")
            except Exception:
                message, code = response.text[:500], None
            raise BlitzHTTPError(response.status_code, message, code,
                                 response.headers.get("x-request-id"))
        if codecs.is_msgpack(response.headers.get("content-type")):
            return codecs.unpack(response.content, max_buffer_size=max(len(response.content), 1))
        return codecs.loads_json(response.content)

    @classmethod
    def embeddings(cls, response: httpx.Response) -> np.ndarray:
        return cls.decode(response)["embeddings"]

    @classmethod
    def chunks(cls, response: httpx.Response) -> list[TextChunks]:
        return [TextChunks(c["embeddings"],
                           np.asarray(c["offsets"], dtype=np.int64).reshape(-1, 2))
                for c in cls.decode(response)["chunks"]]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    """Blocking client. ``transport`` accepts any httpx transport (tests serve the real API).

    The options of ``embed`` and ``rerank`` are the request bodies' (docs/api.md); one left
    as None is not sent, so the server's default applies. ``priority`` (high | normal |
    low) is the client's default for every call (a call's own wins): a bulk job's client
    says ``priority="low"`` once (docs/operations.md, "Priorities")."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 timeout: float = 60.0, transport: httpx.BaseTransport | None = None,
                 priority: PriorityName | None = None):
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key),
                                  timeout=timeout, transport=transport)
        self.priority = priority

    def embed(self, texts: str | list[str], model: str | None = None, *,
              normalize: bool | None = None, truncate: bool | None = None,
              dimensions: int | None = None, dtype: OutputDtype | None = None,
              prompt_name: str | None = None, instruction: str | None = None,
              long_inputs: LongInputs | None = None,
              priority: PriorityName | None = None) -> np.ndarray:
        request = _Calls.embed(texts, model, normalize=normalize, truncate=truncate,
                               dimensions=dimensions, dtype=dtype, prompt_name=prompt_name,
                               instruction=instruction, long_inputs=long_inputs,
                               priority=priority or self.priority)
        return _Calls.embeddings(self._http.request(**request))

    def embed_images(self, images: list[bytes | str], model: str | None = None, *,
                     normalize: bool | None = None, dimensions: int | None = None,
                     dtype: OutputDtype | None = None,
                     priority: PriorityName | None = None) -> np.ndarray:
        """A dual encoder's (CLIP, SigLIP) vectors of image files, in its texts' space."""
        request = _Calls.embed_images(images, model, normalize=normalize, dimensions=dimensions,
                                      dtype=dtype, priority=priority or self.priority)
        return _Calls.embeddings(self._http.request(**request))

    def embed_parts(self, parts: list[Any], model: str | None = None, *,
                    instruction: str | None = None, normalize: bool | None = None,
                    dimensions: int | None = None, dtype: OutputDtype | None = None,
                    priority: PriorityName | None = None) -> np.ndarray:
        """A vision-language embedder's vector of each document: a text, a part
        (``{"text": ...}``, ``{"image": file bytes}``) or a list of parts, in order."""
        request = _Calls.embed_parts(parts, model, instruction=instruction, normalize=normalize,
                                     dimensions=dimensions, dtype=dtype,
                                     priority=priority or self.priority)
        return _Calls.embeddings(self._http.request(**request))

    def rerank_parts(self, query: Any, documents: list[Any], model: str | None = None, *,
                     top_n: int | None = None, instruction: str | None = None,
                     priority: PriorityName | None = None) -> dict[str, Any]:
        """Documents of images or parts scored against ``query`` (a text or parts)."""
        request = _Calls.rerank_parts(query, documents, model, top_n=top_n,
                                      instruction=instruction,
                                      priority=priority or self.priority)
        return _Calls.decode(self._http.request(**request))

    def embed_multivector(self, texts: str | list[str] | None = None,
                          model: str | None = None, *,
                          images: list[bytes | str] | None = None,
                          input_type: Literal["query", "document"] | None = None,
                          pool_factor: float | None = None,
                          muvera: bool | dict[str, Any] | None = None,
                          dtype: OutputDtype | None = None,
                          priority: PriorityName | None = None) -> list[np.ndarray]:
        """A late-interaction (ColBERT) model's vectors of each text, as a query's or a
        document's (default), or a visual retriever's (ColPali, ColQwen2) of each page
        (``images``: files' bytes or URLs): one array per input, (vectors, dimension), or
        with ``muvera`` one MUVERA row each."""
        request = _Calls.embed_multivector(texts, model, images=images, input_type=input_type,
                                           pool_factor=pool_factor, muvera=muvera, dtype=dtype,
                                           priority=priority or self.priority)
        return list(_Calls.embeddings(self._http.request(**request)))

    def embed_late_chunks(self, texts: list[str], model: str | None = None, *,
                          pooling: str | None = None, normalize: bool | None = None,
                          dimensions: int | None = None, dtype: OutputDtype | None = None,
                          priority: PriorityName | None = None) -> np.ndarray:
        """Late chunking: ``texts`` are one document's chunks, in order; one vector per
        chunk, each pooled from its tokens of the document's one run."""
        request = _Calls.embed_late_chunks(texts, model, pooling=pooling, normalize=normalize,
                                           dimensions=dimensions, dtype=dtype,
                                           priority=priority or self.priority)
        return _Calls.embeddings(self._http.request(**request))

    def embed_chunks(self, texts: str | list[str], model: str | None = None, *,
                     normalize: bool | None = None, dimensions: int | None = None,
                     dtype: OutputDtype | None = None, prompt_name: str | None = None,
                     instruction: str | None = None,
                     priority: PriorityName | None = None) -> list[TextChunks]:
        """Each text chunked (``return_chunks``): its windows' vectors and [start, end)
        character offsets (docs/models.md, "Long inputs")."""
        request = _Calls.embed(texts, model, normalize=normalize, dimensions=dimensions,
                               dtype=dtype, prompt_name=prompt_name, instruction=instruction,
                               return_chunks=True, priority=priority or self.priority)
        return _Calls.chunks(self._http.request(**request))

    def rerank(self, query: str, documents: list[str], model: str | None = None, *,
               top_n: int | None = None, return_documents: bool | None = None,
               truncate: bool | None = None,
               priority: PriorityName | None = None) -> dict[str, Any]:
        request = _Calls.rerank(query, documents, model, top_n=top_n,
                                return_documents=return_documents, truncate=truncate,
                                priority=priority or self.priority)
        return _Calls.decode(self._http.request(**request))

    def models(self) -> list[dict[str, Any]]:
        return _Calls.decode(self._http.request(**_Calls.models()))["data"]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """Asyncio client with the same methods as ``Client``."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 timeout: float = 60.0, transport: httpx.AsyncBaseTransport | None = None,
                 priority: PriorityName | None = None):
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key),
                                       timeout=timeout, transport=transport)
        self.priority = priority

    async def embed(self, texts: str | list[str], model: str | None = None, *,
                    normalize: bool | None = None, truncate: bool | None = None,
                    dimensions: int | None = None, dtype: OutputDtype | None = None,
                    prompt_name: str | None = None, instruction: str | None = None,
                    long_inputs: LongInputs | None = None,
                    priority: PriorityName | None = None) -> np.ndarray:
        request = _Calls.embed(texts, model, normalize=normalize, truncate=truncate,
                               dimensions=dimensions, dtype=dtype, prompt_name=prompt_name,
                               instruction=instruction, long_inputs=long_inputs,
                               priority=priority or self.priority)
        return _Calls.embeddings(await self._http.request(**request))

    async def embed_images(self, images: list[bytes | str], model: str | None = None, *,
                           normalize: bool | None = None, dimensions: int | None = None,
                           dtype: OutputDtype | None = None,
                           priority: PriorityName | None = None) -> np.ndarray:
        """A dual encoder's (CLIP, SigLIP) vectors of image files, in its texts' space."""
        request = _Calls.embed_images(images, model, normalize=normalize, dimensions=dimensions,
                                      dtype=dtype, priority=priority or self.priority)
        return _Calls.embeddings(await self._http.request(**request))

    async def embed_parts(self, parts: list[Any], model: str | None = None, *,
                          instruction: str | None = None, normalize: bool | None = None,
                          dimensions: int | None = None, dtype: OutputDtype | None = None,
                          priority: PriorityName | None = None) -> np.ndarray:
        """A vision-language embedder's vector of each document: a text, a part
        (``{"text": ...}``, ``{"image": file bytes}``) or a list of parts, in order."""
        request = _Calls.embed_parts(parts, model, instruction=instruction, normalize=normalize,
                                     dimensions=dimensions, dtype=dtype,
                                     priority=priority or self.priority)
        return _Calls.embeddings(await self._http.request(**request))

    async def rerank_parts(self, query: Any, documents: list[Any], model: str | None = None,
                           *, top_n: int | None = None, instruction: str | None = None,
                           priority: PriorityName | None = None) -> dict[str, Any]:
        """Documents of images or parts scored against ``query`` (a text or parts)."""
        request = _Calls.rerank_parts(query, documents, model, top_n=top_n,
                                      instruction=instruction,
                                      priority=priority or self.priority)
        return _Calls.decode(await self._http.request(**request))

    async def embed_multivector(self, texts: str | list[str] | None = None,
                                model: str | None = None, *,
                                images: list[bytes | str] | None = None,
                                input_type: Literal["query", "document"] | None = None,
                                pool_factor: float | None = None,
                                muvera: bool | dict[str, Any] | None = None,
                                dtype: OutputDtype | None = None,
                                priority: PriorityName | None = None) -> list[np.ndarray]:
        """A late-interaction (ColBERT) model's vectors of each text, as a query's or a
        document's (default), or a visual retriever's (ColPali, ColQwen2) of each page
        (``images``: files' bytes or URLs): one array per input, (vectors, dimension), or
        with ``muvera`` one MUVERA row each."""
        request = _Calls.embed_multivector(texts, model, images=images, input_type=input_type,
                                           pool_factor=pool_factor, muvera=muvera, dtype=dtype,
                                           priority=priority or self.priority)
        return list(_Calls.embeddings(await self._http.request(**request)))

    async def embed_late_chunks(self, texts: list[str], model: str | None = None, *,
                                pooling: str | None = None, normalize: bool | None = None,
                                dimensions: int | None = None, dtype: OutputDtype | None = None,
                                priority: PriorityName | None = None) -> np.ndarray:
        """Late chunking: ``texts`` are one document's chunks, in order; one vector per
        chunk, each pooled from its tokens of the document's one run."""
        request = _Calls.embed_late_chunks(texts, model, pooling=pooling, normalize=normalize,
                                           dimensions=dimensions, dtype=dtype,
                                           priority=priority or self.priority)
        return _Calls.embeddings(await self._http.request(**request))

    async def embed_chunks(self, texts: str | list[str], model: str | None = None, *,
                           normalize: bool | None = None, dimensions: int | None = None,
                           dtype: OutputDtype | None = None, prompt_name: str | None = None,
                           instruction: str | None = None,
                           priority: PriorityName | None = None) -> list[TextChunks]:
        """Each text chunked (``return_chunks``): its windows' vectors and [start, end)
        character offsets (docs/models.md, "Long inputs")."""
        request = _Calls.embed(texts, model, normalize=normalize, dimensions=dimensions,
                               dtype=dtype, prompt_name=prompt_name, instruction=instruction,
                               return_chunks=True, priority=priority or self.priority)
        return _Calls.chunks(await self._http.request(**request))

    async def rerank(self, query: str, documents: list[str], model: str | None = None, *,
                     top_n: int | None = None, return_documents: bool | None = None,
                     truncate: bool | None = None,
               priority: PriorityName | None = None) -> dict[str, Any]:
        request = _Calls.rerank(query, documents, model, top_n=top_n,
                                return_documents=return_documents, truncate=truncate,
                                priority=priority or self.priority)
        return _Calls.decode(await self._http.request(**request))

    async def models(self) -> list[dict[str, Any]]:
        return _Calls.decode(await self._http.request(**_Calls.models()))["data"]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
