"""Images through the ingress's one request pipeline (``EmbeddingService.run``): embedded
by a dual encoder (CLIP, SigLIP), and scored against a text in the same space.

A request's images become encoded bytes with their headers checked here
(``blitz.images.inputs``: base64, data URLs, allowed URLs; format, declared pixels and
frames), and their declared pixels summed within ``images.max_request_pixels``, before
any model work; they travel to the pool as they came, in jobs of at most the pool's batch
limit, ``images.max_job_bytes`` and ``images.max_job_pixels`` (a job carries its
``pixels``), and are routed by the router's size rule for images
(``routing.gpu_min_images``). The reply is the text reply's, in shape and
format: ``EmbedResult``, ``RerankResult``, ``SimilarityResult``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blitz.encoders.base import stacked
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import InvalidValue
from blitz.hop_messages import (
    EmbedResult,
    ImageEmbedJob,
    RerankHit,
    RerankResult,
    SimilarityResult,
    Usage,
    image_units,
)
from blitz.images.decode import in_image_thread
from blitz.images.inputs import SizedImage, image_bytes, jobs_of, sized_images
from blitz.ingress.limits import check_texts
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec

Images = list[bytes] | list[str] | list[Any]
"""Each an encoded image file: bytes, base64, a data URL, or a URL under images.url_allow."""


class ImageService:
    def __init__(self, service: EmbeddingService):
        self.service = service
        self.limits = service.settings.images

    async def embed_images(self, images: Images, model: str | None = None, *,
                           normalize: bool | None = None, dimensions: int | None = None,
                           dtype: OutputDtype = "float32",
                           record: RequestRecord | None = None) -> EmbedResult:
        """Embed ``images`` (each an encoded file: bytes, base64, a data URL, or an
        ``http(s)`` URL under ``images.url_allow``) with the dual encoder ``model`` (the
        default when None): one row each, in the space of its texts. ``normalize``,
        ``dimensions`` and ``dtype`` as for ``embed``."""
        service = self.service
        with service.recorded(record, "handle.embed_images") as record:
            spec, pool, values = await self._rows(record, images, model, normalize, dimensions)
            normalized = spec.normalize if normalize is None else normalize
            values = quantize(truncate_dimensions(values, dimensions, normalized), dtype)
            return EmbedResult(values, spec.id, Usage.of(0), pool)

    async def rerank_images(self, query: str, images: Images, model: str | None = None, *,
                            top_n: int | None = None,
                            record: RequestRecord | None = None) -> RerankResult:
        """Score ``images`` against the text ``query``, best first: the cosine of their
        unit vectors (a dual encoder's texts and images share one space)."""
        with self.service.recorded(record, "handle.rerank_images") as record:
            scores, spec, pool, tokens = await self._scores(record, query, images, model)
            if top_n is not None and top_n < 1:
                raise InvalidValue("top_n must be at least 1", param="top_n")
            order = np.argsort(-scores, kind="stable")[: top_n or len(scores)]
            return RerankResult([RerankHit(int(i), float(scores[i])) for i in order],
                                spec.id, Usage.of(tokens), pool)

    async def similarity_images(self, source: str, images: Images,
                                model: str | None = None, *,
                                record: RequestRecord | None = None) -> SimilarityResult:
        """The cosine similarity of the text ``source`` to each of ``images``, in order
        (TEI's ``/similarity`` with images for its sentences)."""
        with self.service.recorded(record, "handle.similarity_images") as record:
            scores, spec, pool, tokens = await self._scores(record, source, images, model)
            return SimilarityResult([float(x) for x in scores], spec.id, Usage.of(tokens),
                                    pool)

    async def _rows(self, record: RequestRecord, images: Images, model: str | None,
                    normalize: bool | None, dimensions: int | None = None
                    ) -> tuple[ModelSpec, str, np.ndarray]:
        """The images' rows from the pipeline: the model checked first, then the images
        (sized, fetched, headers checked), then routed and sent."""
        service = self.service
        record.images = len(images) if isinstance(images, list) else 0
        record.model = model or ""
        spec = service.spec(model)
        record.model = spec.id
        if "embed_images" not in kind_of(spec.kind).serves:
            raise InvalidValue(f"model {spec.id!r} is of kind {spec.kind}; images need a model of "
                               "kind dual-encoder (CLIP, SigLIP) or vl-embedding; a vl-reranker "
                               "takes documents of parts ([{\"image\": ...}])", param="model")
        service._check_dimensions(spec, dimensions)
        limits = self.limits
        data = await image_bytes(images, limits)
        sized = await in_image_thread(sized_images, data, limits, param="images",
                                      timeout_s=limits.decode_timeout_s, what="check")
        wanted = spec.normalize if normalize is None else normalize

        def job(_: ModelSpec, chunk: list[SizedImage]) -> ImageEmbedJob:
            pixels = sum(image.pixels for image in chunk)
            return ImageEmbedJob([image.data for image in chunk], normalize=wanted,
                                 pixels=pixels, first=chunk[0].index,
                                 units=image_units(len(chunk), pixels))

        ran = await service.run(
            record, spec.id, lambda _: sized, job, serves="embed_images",
            split=lambda items, size: jobs_of(items, size, limits.max_job_bytes,
                                              limits.max_job_pixels))
        return spec, ran.pool, stacked(ran.parts)

    async def _scores(self, record: RequestRecord, text: str, images: Images,
                      model: str | None) -> tuple[np.ndarray, ModelSpec, str, int]:
        """The cosine of ``text``'s unit vector with each image's, and the text's tokens."""
        if not isinstance(text, str):
            raise InvalidValue("the query must be a text", param="query")
        check_texts([text], self.service.settings.limits)
        spec, pool, rows = await self._rows(record, images, model, True)
        query = await self.service.embed([text], model=spec.id, normalize=True,
                                         record=record)
        record.pool = pool  # the images' pool: most of the work
        scores = (rows @ query.embeddings[0]).astype(np.float32)
        return scores, spec, pool, query.usage.total_tokens
