"""Load failures, wrapped once and remembered for a while.

A model that failed to load fails again at once for ``ttl_s`` instead of retrying a
download, an ONNX export or a missing directory on every request (and, with Serve's
multiplexing, evicting a healthy model each time).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from blitz.errors import BlitzError, LoadProblem, ModelLoadFailed

logger = logging.getLogger("blitz.models")


def as_load_failure(model_id: str, exc: BaseException,
                    source: str | None = None) -> ModelLoadFailed:
    """The ``ModelLoadFailed`` for whatever loading ``model_id`` (from ``source``) raised.

    The one place a load failure is made: the layers under the loader raise their own
    plain errors (a ``LoadProblem`` says what is wrong in words fit for the log, with a
    ``hint`` fit for a client), and the loader's boundary (``load_encoder``) and the pool
    (a load past its deadline) pass them here. Its full text (paths, exception text)
    stays server-side.
    """
    if isinstance(exc, ModelLoadFailed):  # made here before (a remembered failure)
        return ModelLoadFailed(exc.message, exc.param, model=model_id, hint=exc.hint)
    if isinstance(exc, LoadProblem):
        return ModelLoadFailed(exc.message, model=model_id, hint=exc.hint)
    detail = exc.message if isinstance(exc, BlitzError) else f"{type(exc).__name__}: {exc}"
    origin = f" from {source}" if source else ""
    return ModelLoadFailed(f"model {model_id!r} failed to load{origin}: {detail}",
                           model=model_id)


class LoadFailures:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._failed: dict[str, tuple[float, ModelLoadFailed]] = {}

    def remember(self, model_id: str, error: ModelLoadFailed) -> None:
        logger.error("model %r failed to load (retried after %gs): %s", model_id,
                     self.ttl_s, error.message)
        self._failed[model_id] = (self._clock() + self.ttl_s, error)

    def recent(self) -> dict[str, ModelLoadFailed]:
        """The failures still remembered, by model id."""
        now = self._clock()
        return {m: error for m, (until, error) in self._failed.items() if now < until}

    def forget(self, model_id: str) -> None:
        self._failed.pop(model_id, None)

    def check(self, model_id: str) -> None:
        """Raise the remembered failure while it is fresh."""
        entry = self._failed.get(model_id)
        if entry is None:
            return
        until, error = entry
        if self._clock() >= until:
            del self._failed[model_id]
            return
        raise error
