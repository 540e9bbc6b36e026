"""Documents of text and image parts through the ingress's one request pipeline: embedded
by a vision-language embedder, and reranked by a vision-language reranker (or by cosine,
where the model embeds).

A document is an ordered list of parts, each a text or an image, in any of the shapes the
APIs Blitz speaks send them (``parts_of``): a string (a text), ``{"text": ...}``,
``{"image": ...}`` (Jina's), ``{"type": "text", "text"}``, ``{"type": "image_url",
"image_url": {"url"} | url}`` (OpenAI's, vLLM's, Cohere's, Voyage's),
``{"type": "image_base64", "image_base64"}`` (Voyage's), ``{"type": "image", "image"}``,
``{"content": [parts]}`` (Cohere's and Voyage's inputs), or a list of parts. An image is
what ``blitz.images.inputs`` takes: bytes, base64, a data URL, or an allowed URL.

Before any model work: the texts are held to the text limits, the images are sized,
fetched and their headers checked (an error names the part: ``inputs[2][1]``), their
declared pixels summed within ``images.max_request_pixels``, and their visual tokens
counted from their declared sizes with the model's resize rule
(``blitz.vision_language.visual.ImageShape``) within
``limits.max_visual_tokens_per_request``. Only encoded bytes cross the hop
(``PartsJob``); a pool decodes them before the model's queue.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from blitz.encoders.base import stacked
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import InvalidValue, echo
from blitz.hop_messages import (
    PIXELS_PER_UNIT,
    EmbedResult,
    PartsJob,
    RerankHit,
    RerankResult,
    Usage,
)
from blitz.images.decode import in_image_thread
from blitz.images.inputs import image_bytes, sized_images
from blitz.ingress.limits import check_count, check_length, check_prompted, over
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec
from blitz.vision_language.visual import ImageShape, read_image_shape

Inputs = list[Any]
"""Documents, each a text, a part, or a list of parts (``parts_of``)."""


class ImageRef(NamedTuple):
    """An image part as the client sent it: bytes, base64, a data URL or a URL."""

    source: Any


Part = str | ImageRef


def parts_of(item: Any, param: str) -> list[Part]:
    """One document's parts, in order, from any of the shapes the module doc lists; a 422
    naming ``param`` for anything else."""
    if isinstance(item, str):
        return [item]
    if isinstance(item, (bytes, bytearray, memoryview)):
        return [ImageRef(bytes(item))]
    if isinstance(item, ImageRef):
        return [item]
    if isinstance(item, list):
        out: list[Part] = []
        for j, part in enumerate(item):
            if isinstance(part, list):
                raise InvalidValue(f"{param}[{j}] is a list inside a document's parts; a "
                                   "part is a text or an image", param=param)
            out.extend(parts_of(part, f"{param}[{j}]"))
        return out
    if not isinstance(item, dict):
        raise InvalidValue(f"{param} must be a text, an image or a list of parts, not "
                           f"{type(item).__name__}", param=param)
    if "content" in item and "type" not in item:
        content = item["content"]
        return parts_of(content if isinstance(content, list) else [content], f"{param}.content")
    kind = item.get("type")
    if kind is None:  # Jina's {text} | {image}: one part each, in the object's order
        out = []
        for key, value in item.items():
            if key == "text":
                out.append(_text(value, f"{param}.text"))
            elif key in ("image", "image_url"):
                out.append(ImageRef(_url(value)))
            else:
                raise InvalidValue(f"{param} has {echo(key)!r}; a part is {{\"text\": ...}} "
                                   "or {\"image\": ...}", param=param)
        if not out:
            raise InvalidValue(f"{param} is an empty part", param=param)
        return out
    if kind in ("text", "input_text"):
        return [_text(item.get("text"), f"{param}.text")]
    if kind in ("image_url", "input_image"):
        return [ImageRef(_url(item.get("image_url")))]
    if kind == "image_base64":
        return [ImageRef(item.get("image_base64"))]
    if kind == "image":
        return [ImageRef(item.get("image"))]
    raise InvalidValue(f"{param} is a part of type {echo(str(kind))!r}; the types taken are "
                       "text, image_url, image_base64 and image", param=param)


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"{param} must be a string", param=param)
    return value


def _url(value: Any) -> Any:
    """An ``image_url`` as OpenAI ({url}) or Voyage (the URL itself) send it."""
    return value.get("url") if isinstance(value, dict) else value


@dataclass(frozen=True)
class Prepared:
    """A request's documents, checked and with their images' bytes: ``documents`` hold
    texts and bytes in order; per document its units, declared pixels and visual tokens."""

    documents: list[tuple]
    units: list[int]
    pixels: list[int]
    visual: list[int]
    texts: int


class PartsService:
    def __init__(self, service: EmbeddingService):
        self.service = service
        self.limits = service.settings.images
        # each spec's resize rule, keyed by what it is read from (a changed spec: a new key)
        self._shapes: dict[tuple, ImageShape] = {}

    async def embed_parts(self, inputs: Inputs, model: str | None = None, *,
                          instruction: str | None = None, normalize: bool | None = None,
                          dimensions: int | None = None, dtype: OutputDtype = "float32",
                          truncate: bool = True, record: RequestRecord | None = None
                          ) -> EmbedResult:
        """One vector per input, a document of text and image parts in order (a text, a
        part, or a list of parts: ``blitz.ingress.parts.parts_of``), embedded by the
        vision-language embedder ``model``; ``instruction`` its system turn (the model's
        default when None). ``normalize``, ``dimensions`` and ``dtype`` as for ``embed``.
        ``usage`` counts every token, visual ones in ``image_tokens``."""
        service = self.service
        with service.recorded(record, "handle.embed_parts") as record:
            spec = self._spec(record, model, "embed_parts", "documents of text and image "
                              "parts need a vision-language embedder (kind vl-embedding)")
            service._check_dimensions(spec, dimensions)
            ready = await self.prepare(spec, inputs, "input", instruction)
            wanted = spec.normalize if normalize is None else normalize

            def job(_: ModelSpec, chunk: list[int]) -> PartsJob:
                return PartsJob([ready.documents[i] for i in chunk], normalize=wanted,
                                instruction=instruction, truncate=truncate,
                                pixels=sum(ready.pixels[i] for i in chunk), first=chunk[0])

            ran = await self._run(record, spec, ready, job, "embed_parts")
            values = quantize(truncate_dimensions(stacked(ran.parts), dimensions, wanted),
                              dtype)
            return EmbedResult(values, spec.id, self._usage(record.tokens, ready), ran.pool)

    async def rerank_parts(self, query: Any, documents: Inputs, model: str | None = None, *,
                           top_n: int | None = None, instruction: str | None = None,
                           truncate: bool = True, record: RequestRecord | None = None
                           ) -> RerankResult:
        """Score ``documents`` (each a document of parts, as ``embed_parts`` takes) against
        ``query`` (a text or parts), best first: by a vision-language reranker's formula,
        or, for a vision-language embedder, by the cosine of their vectors."""
        service = self.service
        with service.recorded(record, "handle.rerank_parts") as record:
            spec = self._spec(record, model, None, "")
            serves = kind_of(spec.kind).serves
            if top_n is not None and top_n < 1:
                raise InvalidValue("top_n must be at least 1", param="top_n")
            if top_n is not None and top_n > service.settings.limits.max_top_n:
                raise over("max_top_n", f"top_n={top_n}", service.settings.limits.max_top_n,
                           "top_n")
            if "rerank_parts" in serves:
                scores, usage, pool = await self._model_scores(record, spec, query, documents,
                                                               instruction, truncate)
            elif "embed_parts" in serves:
                rows = await self.embed_parts([query, *_as_list(documents)], spec.id,
                                              instruction=instruction, normalize=True,
                                              truncate=truncate, record=record)
                scores = (rows.embeddings[1:] @ rows.embeddings[0]).astype(np.float32)
                usage, pool = rows.usage, rows.pool
            else:
                raise InvalidValue(
                    f"model {spec.id!r} is a {spec.kind}; documents with images are reranked "
                    "by a vision-language reranker (kind vl-reranker) or embedder "
                    "(vl-embedding); a dual encoder reranks images sent as `images`",
                    param="model")
            order = np.argsort(-scores, kind="stable")[: top_n or len(scores)]
            return RerankResult([RerankHit(int(i), float(scores[i])) for i in order],
                                spec.id, usage, pool)

    async def _model_scores(self, record: RequestRecord, spec: ModelSpec, query: Any,
                            documents: Inputs, instruction: str | None, truncate: bool
                            ) -> tuple[np.ndarray, Usage, str]:
        asked = await self.prepare(spec, [query], "query", instruction)
        ready = await self.prepare(spec, documents, "documents", None,
                                   visual_plus=asked.visual[0] * len(_as_list(documents)))
        head = asked.documents[0]

        def job(_: ModelSpec, chunk: list[int]) -> PartsJob:
            return PartsJob([ready.documents[i] for i in chunk], query=head,
                            instruction=instruction, truncate=truncate,
                            pixels=sum(ready.pixels[i] for i in chunk) + asked.pixels[0],
                            first=chunk[0])

        ran = await self._run(record, spec, ready, job, "rerank_parts")
        scores = np.concatenate([p.values for p in ran.parts]).astype(np.float32)
        return scores, self._usage(record.tokens, ready, asked), ran.pool

    # ---- the pipeline ------------------------------------------------------------------

    def _spec(self, record: RequestRecord, model: str | None, serves: str | None,
              refusal: str) -> ModelSpec:
        """The model, checked before any input is read."""
        record.model = model or ""
        spec = self.service.spec(model)
        record.model = spec.id
        if serves is not None and serves not in kind_of(spec.kind).serves:
            raise InvalidValue(f"model {spec.id!r} is of kind {spec.kind}; {refusal}",
                               param="model")
        return spec

    async def _run(self, record: RequestRecord, spec: ModelSpec, ready: Prepared,
                   job: Any, serves: Any) -> Any:
        record.texts = ready.texts
        record.images = sum(isinstance(p, bytes) for doc in ready.documents for p in doc)
        units = ready.units

        async def cost(_: ModelSpec, items: list[int]) -> list[int]:
            return [units[i] for i in items]

        return await self.service.run(
            record, spec.id, lambda _: list(range(len(ready.documents))), job, serves=serves,
            split=_in_order if record.images else None, cost=cost)

    async def prepare(self, spec: ModelSpec, inputs: Inputs, field: str,
                      instruction: str | None, visual_plus: int = 0) -> Prepared:
        """``inputs`` checked and their images read (``blitz.images.inputs``), within the
        budget: texts, images, pixels and visual tokens (``visual_plus`` more counted)."""
        limits = self.service.settings.limits
        items = _as_list(inputs, field)
        check_count(len(items), limits, field, field)
        check_prompted([], 0, limits, instruction=instruction)
        documents = [parts_of(item, f"{field}[{i}]") for i, item in enumerate(items)]
        names: list[str] = []
        sources: list[Any] = []
        texts = 0
        for i, document in enumerate(documents):
            if not document:
                raise InvalidValue(f"{field}[{i}] has no part: send a text or an image",
                                   param=field)
            for j, part in enumerate(document):
                where = f"{field}[{i}][{j}]"
                if isinstance(part, ImageRef):
                    names.append(where)
                    sources.append(part.source)
                else:
                    texts += 1
                    check_length(len(part), limits, where, field)
                    if not part.strip():
                        raise InvalidValue(f"{where} is an empty text", param=field)
        check_count(texts, limits, "texts", field)
        data: list[bytes] = []
        sizes: list[tuple[int, int]] = []
        if sources:
            images = self.limits
            data = await image_bytes(sources, images, field, names=names)
            sized = await in_image_thread(sized_images, data, images, field, names,
                                          param=field, timeout_s=images.decode_timeout_s,
                                          what="check")
            sizes = [image.size for image in sized]
        shape = self._shape(spec) if sources else ImageShape()
        out: list[tuple] = []
        units: list[int] = []
        pixels: list[int] = []
        visual: list[int] = []
        k = 0
        total = visual_plus
        budget = limits.max_visual_tokens_per_request
        for document in documents:
            parts: list[Any] = []
            images_here = pixels_here = tokens_here = 0
            for part in document:
                if isinstance(part, ImageRef):
                    width, height = sizes[k]
                    tokens = shape.tokens(width, height)
                    total += tokens
                    if total > budget:
                        raise over("max_visual_tokens_per_request",
                                   f"the images up to {names[k]} take {total} visual tokens in "
                                   f"model {spec.id!r}", budget, field)
                    parts.append(data[k])
                    images_here += 1
                    pixels_here += width * height
                    tokens_here += tokens
                    k += 1
                else:
                    parts.append(part)
            out.append(tuple(parts))
            pixels.append(pixels_here)
            visual.append(tokens_here)
            units.append(max(1, images_here, -(-pixels_here // PIXELS_PER_UNIT)))
        return Prepared(out, units, pixels, visual, texts)

    def _shape(self, spec: ModelSpec) -> ImageShape:
        """The model's resize rule from its folder where it is on this machine; else
        Qwen2-VL's (28-pixel tokens: more of them than Qwen3-VL's 32), capped alike."""
        key = (spec.id, spec.source, spec.image_max_tokens, spec.image_min_tokens)
        shape = self._shapes.get(key)
        if shape is None:
            base = ImageShape()
            if not spec.is_fake and spec.location().is_local:
                from blitz.loading.fetch import resolve_source

                try:
                    base = read_image_shape(resolve_source(spec, self.service.settings.cache_dir))
                except (OSError, ValueError):
                    base = ImageShape()
            shape = base.capped(spec.image_max_tokens, spec.image_min_tokens)
            if len(self._shapes) >= 4 * max(1, len(self.service.registry)):
                self._shapes.clear()  # specs changed many times over: start again
            self._shapes[key] = shape
        return shape

    @staticmethod
    def _usage(tokens: int, *ready: Prepared) -> Usage:
        return Usage(tokens, tokens, image_tokens=sum(sum(r.visual) for r in ready),
                     image_pixels=sum(sum(r.pixels) for r in ready))


def _in_order(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _as_list(inputs: Any, field: str = "input") -> list[Any]:
    if not isinstance(inputs, list) or not inputs:
        raise InvalidValue(f"{field} must be a non-empty list", param=field)
    return inputs


def data_url(data: bytes, media: str = "image/png") -> str:
    """``data`` as a data URL (a handle caller's or a test's image in JSON)."""
    return f"data:{media};base64,{base64.b64encode(data).decode()}"
