"""Images made ready before their model call, off its critical path, one at a time.

An ``ImageEmbedJob`` (or a ``PartsJob`` or ``MultiVectorJob`` holding images) arrives with encoded bytes. Before it enters the model's queue, its
images are decoded and resized by the model's image processor one after another, each in
one call in the images' own bounded threads (``blitz.images.decode.in_image_thread``,
within ``decode_timeout_s``): a full-size image lives only inside that call, dropped as
soon as the processor has made it the model's input size. So a job holds at most one
full-size image at a time, and a process at most ``THREADS`` whatever the jobs, instead
of a job's every image at once (a 4.9 KB 1-bit PNG decodes to 114 MiB of RGB). A
``PreparedImages`` job holds the model's input, one row per image; a ``PartsJob`` gets
each image part replaced by its model input (``Encoder.prepare_part``), a
``MultiVectorJob`` each page. So a worker thread's
turn is the model call alone, and the next request's images are decoded while the
current batch runs. A job whose images fail gets its error (a 4xx naming ``images[i]``,
``i`` its index in the request) and never enters the queue; the request's other jobs go
on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from blitz.encoders.base import Encoded, Encoder
from blitz.hop_messages import ImageEmbedJob, MultiVectorJob, PartsJob, _Job
from blitz.images.decode import decode, in_image_thread
from blitz.settings.images import ImageSettings


@dataclass(frozen=True)
class PreparedImages(_Job):
    """An image job's pixels, ready for ``Encoder.embed_prepared`` (never crosses a hop):
    ``prepared`` is a list of rows, one per image (``prepare_images``' output row by row);
    its priority is its job's."""

    prepared: Any
    count: int
    normalize: bool = True
    trace: str | None = None

    def __len__(self) -> int:
        return self.count

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_prepared(self.prepared, normalize=self.normalize)


Leased = Callable[[Callable[[Encoder], Any]], Awaitable[Any]]
"""Runs a function of the model's encoder in a thread, holding a lease on the model."""


async def prepare(job: ImageEmbedJob, limits: ImageSettings, leased: Leased
                  ) -> PreparedImages:
    """``job``'s images decoded and processed one at a time, each within its deadline."""
    # the loaded encoder; its image processor needs no lease: an eviction frees the
    # model's weights, never its processor
    encoder: Encoder = await leased(lambda encoder: encoder)
    rows: list[Any] = []
    for i, data in enumerate(job.images):
        param = f"images[{job.first + i}]"
        rows.extend(await in_image_thread(prepared_image, encoder, data, limits, param,
                                          timeout_s=limits.decode_timeout_s, param=param))
    return PreparedImages(rows, len(rows), job.normalize, job.trace, priority=job.priority)


def prepared_image(encoder: Encoder, data: bytes, limits: ImageSettings, param: str
                   ) -> list[Any]:
    """One encoded image as the model's input rows: decoded, resized by the processor,
    and its full-size pixels closed before the rows are returned."""
    image = decode(data, limits, param)
    try:
        return list(encoder.prepare_images([image]))
    finally:
        image.close()


def has_images(job: Any) -> bool:
    """Whether ``job`` holds encoded images to prepare before the queue."""
    return isinstance(job, ImageEmbedJob) or (isinstance(job, (PartsJob, MultiVectorJob))
                                              and job.encoded_images > 0)


async def prepare_parts(job: PartsJob, limits: ImageSettings, leased: Leased) -> PartsJob:
    """``job`` with each encoded image part decoded and processed, one at a time, each
    within its deadline (an error names ``inputs[i][j]``, ``i`` the request's index)."""
    encoder: Any = await leased(lambda encoder: encoder)

    async def ready(document: tuple, param: str) -> tuple:
        parts: list[Any] = []
        for j, part in enumerate(document):
            if isinstance(part, bytes):
                where = f"{param}[{j}]"
                part = await in_image_thread(prepared_part, encoder, part, limits, where,
                                             timeout_s=limits.decode_timeout_s, param=where)
            parts.append(part)
        return tuple(parts)

    documents = [await ready(doc, f"inputs[{job.first + i}]")
                 for i, doc in enumerate(job.documents)]
    query = None if job.query is None else await ready(job.query, "query")
    return dataclasses.replace(job, documents=documents, query=query)


async def prepare_pages(job: MultiVectorJob, limits: ImageSettings, leased: Leased
                        ) -> MultiVectorJob:
    """``job`` with each encoded page decoded and resized, one at a time, each within its
    deadline (an error names ``images[i]``, ``i`` the request's index)."""
    encoder: Any = await leased(lambda encoder: encoder)
    pages: list[Any] = []
    for i, data in enumerate(job.images or ()):
        where = f"images[{job.first + i}]"
        pages.append(await in_image_thread(prepared_part, encoder, data, limits, where,
                                           timeout_s=limits.decode_timeout_s, param=where)
                     if isinstance(data, bytes) else data)
    return dataclasses.replace(job, images=pages)


def prepared_part(encoder: Any, data: bytes, limits: ImageSettings, param: str) -> Any:
    """One encoded image part as the model's input, its full-size pixels closed after."""
    image = decode(data, limits, param)
    try:
        return encoder.prepare_part(image)
    finally:
        image.close()


async def with_prepared(jobs: list[Any], limits: ImageSettings, leased: Leased,
                        run: Callable[[list[Any]], Awaitable[list[Encoded | BaseException]]]
                        ) -> list[Encoded | BaseException]:
    """``run(jobs)`` with each image job prepared first; one whose preparation failed gets
    its error in its place."""
    ready: list[Any] = list(await asyncio.gather(
        *(prepare(job, limits, leased) if isinstance(job, ImageEmbedJob)
          else prepare_pages(job, limits, leased) if isinstance(job, MultiVectorJob)
          and has_images(job)
          else prepare_parts(job, limits, leased) if has_images(job) else _as_is(job)
          for job in jobs), return_exceptions=True))
    going = [k for k, job in enumerate(ready) if not isinstance(job, BaseException)]
    if going:
        for k, result in zip(going, await run([ready[k] for k in going]), strict=True):
            ready[k] = result
    return ready


async def _as_is(job: Any) -> Any:
    return job
