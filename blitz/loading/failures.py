"""Load failures, wrapped once and remembered for a while.

A model that failed to load fails again at once for ``ttl_s`` instead of retrying a
download, an ONNX export or a missing directory on every request (and, with Serve's
multiplexing, evicting a healthy model each time).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from blitz.errors import BlitzError, ModelLoadFailed

logger = logging.getLogger("blitz.models")


def as_load_failure(model_id: str, exc: BaseException,
                    source: str | None = None) -> ModelLoadFailed:
    """The ``ModelLoadFailed`` for whatever loading ``model_id`` (from ``source``) raised.

    The one place a load failure is made: lower layers raise specific errors (or a
    ``ModelLoadFailed`` that says what is wrong), and the loader and the pool pass them
    here. Its full text (paths, exception text) stays server-side.
    """
    if isinstance(exc, ModelLoadFailed):
        return ModelLoadFailed(exc.message, exc.param, model=model_id, hint=exc.hint)
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
