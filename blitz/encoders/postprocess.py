"""Output options applied after the model: Matryoshka ``dimensions`` and ``dtype`` quantization.

Quantization uses fixed scales, so a vector's bytes never depend on the batch it came in:
- ``float16``: a plain cast;
- ``int8``: ``round(x * 127)`` clipped to [-127, 127] (for unit-length embeddings);
- ``uint8``: ``round((x + 1) * 127.5)`` clipped to [0, 255];
- ``binary``: sign bits (``x > 0``) packed 8 per byte, stored as int8 (byte - 128),
  sentence-transformers' convention; ``ubinary``: the same bytes as uint8.
Binary shapes are (n, ceil(d / 8)).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from blitz.encoders.base import l2_normalize
from blitz.errors import InvalidValue

OutputDtype = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]


def truncate_dimensions(values: np.ndarray, dimensions: int | None,
                        normalize: bool) -> np.ndarray:
    """Keep the first ``dimensions`` columns, re-normalizing when ``normalize`` is on."""
    if dimensions is None or dimensions == values.shape[1]:
        return values
    if dimensions > values.shape[1]:
        raise InvalidValue(
            f"dimensions={dimensions} is larger than the model's dimension {values.shape[1]}",
            param="dimensions",
        )
    cut = values[:, :dimensions]
    return l2_normalize(cut) if normalize else np.ascontiguousarray(cut)


def quantize(values: np.ndarray, dtype: OutputDtype) -> np.ndarray:
    if dtype == "float32":
        return np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "float16":
        return values.astype(np.float16)
    if dtype == "int8":
        return np.clip(np.rint(values * 127.0), -127, 127).astype(np.int8)
    if dtype == "uint8":
        return np.clip(np.rint((values + 1.0) * 127.5), 0, 255).astype(np.uint8)
    packed = np.packbits(values > 0, axis=1)
    if dtype == "ubinary":
        return packed
    if dtype == "binary":
        return (packed.astype(np.int16) - 128).astype(np.int8)
    raise InvalidValue(f"dtype {dtype!r} is not one of float32, float16, int8, uint8, "
                       "binary, ubinary", param="dtype")
