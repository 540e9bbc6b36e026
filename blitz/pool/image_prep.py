"""Images made ready before their model call, off its critical path.

An ``ImageEmbedJob`` arrives with encoded bytes. Before it enters the model's queue, each
image is decoded in a thread of its own within the image limits
(``blitz.images.decode.decode_async``: a deadline per image), and the model's image
processor (resize, normalize) runs in another thread: a ``PreparedImages`` job holds the
model's input. So a worker thread's turn is the model call alone, and the next request's
images are decoded while the current batch runs. A job whose images fail gets its error
(a 4xx naming ``images[i]``) and never enters the queue; the request's other jobs go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from blitz.encoders.base import Encoded, Encoder
from blitz.hop_messages import ImageEmbedJob, _Job
from blitz.images.decode import decode_async
from blitz.settings.images import ImageSettings


@dataclass(frozen=True)
class PreparedImages(_Job):
    """An image job's pixels, ready for ``Encoder.embed_prepared`` (never crosses a hop);
    its priority is its job's."""

    prepared: Any
    count: int
    normalize: bool = True
    trace: str | None = None

    def __len__(self) -> int:
        return self.count


Leased = Callable[[Callable[[Encoder], Any]], Awaitable[Any]]
"""Runs a function of the model's encoder in a thread, holding a lease on the model."""


async def prepare(job: ImageEmbedJob, limits: ImageSettings, leased: Leased
                  ) -> PreparedImages:
    """``job``'s images decoded (in parallel, each within its deadline) and processed."""
    decoded = await asyncio.gather(*(decode_async(data, limits, f"images[{i}]")
                                     for i, data in enumerate(job.images)))
    prepared = await leased(lambda encoder: encoder.prepare_images(decoded))
    return PreparedImages(prepared, len(decoded), job.normalize, job.trace,
                          priority=job.priority)


async def with_prepared(jobs: list[Any], limits: ImageSettings, leased: Leased,
                        run: Callable[[list[Any]], Awaitable[list[Encoded | BaseException]]]
                        ) -> list[Encoded | BaseException]:
    """``run(jobs)`` with each image job prepared first; one whose preparation failed gets
    its error in its place."""
    ready: list[Any] = list(await asyncio.gather(
        *(prepare(job, limits, leased) if isinstance(job, ImageEmbedJob) else _as_is(job)
          for job in jobs), return_exceptions=True))
    going = [k for k, job in enumerate(ready) if not isinstance(job, BaseException)]
    if going:
        for k, result in zip(going, await run([ready[k] for k in going]), strict=True):
            ready[k] = result
    return ready


async def _as_is(job: Any) -> Any:
    return job
