"""Checks on every reply, and the names of the ways a request can fail.

Error kinds are short strings a report can count:

- ``http_<status>``: the server answered with a status other than 200;
- ``verify_<reason>``: a 200 whose body is wrong (``malformed``, ``count``,
  ``dimension``, ``nonfinite``);
- ``exception_<Type>``: no usable answer at all (``ConnectError``, ``ReadTimeout``...).
"""

from __future__ import annotations

import numpy as np


class VerificationError(Exception):
    """A 200 reply whose embeddings are not what was asked for."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    @property
    def kind(self) -> str:
        return f"verify_{self.reason}"


def http_error_kind(status: int) -> str:
    return f"http_{status}"


def exception_kind(exc: BaseException) -> str:
    return f"exception_{type(exc).__name__}"


class ReplyChecker:
    """Verifies embeddings: one row per text, one dimension for every reply, finite values.

    With ``dimension=None`` the first good reply sets the dimension the rest must match.
    """

    def __init__(self, dimension: int | None = None):
        self.dimension = dimension

    def check(self, embeddings: np.ndarray, count: int) -> None:
        if embeddings.ndim != 2:
            raise VerificationError("malformed", f"embeddings have shape {embeddings.shape}")
        rows, dim = embeddings.shape
        if rows != count:
            raise VerificationError("count", f"{rows} embeddings for {count} texts")
        if self.dimension is None and dim > 0:
            self.dimension = dim
        if dim != self.dimension:
            raise VerificationError("dimension", f"dimension {dim}, expected {self.dimension}")
        if not np.isfinite(embeddings).all():
            raise VerificationError("nonfinite", "embeddings contain NaN or infinity")
