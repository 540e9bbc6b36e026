"""Images as a vision-language decoder sees them: resized to a grid of patches, and the
visual tokens that grid takes in the model's sequence.

Qwen2-VL and Qwen3-VL (and the models built on them: GME, Qwen3-VL-Embedding and
-Reranker, jina-reranker-m0) resize an image so that each side is a multiple of
``patch_size x merge_size`` and its area lies within ``[min_pixels, max_pixels]``
(``smart_resize``, transformers' own formula), cut it into ``patch_size`` patches, and
merge each ``merge_size x merge_size`` of them into one token: an image of a ``t x h x w``
patch grid takes ``t*h*w / merge_size**2`` tokens (``VisualInput.tokens``).

``ImageShape`` is that rule read from the model folder's ``preprocessor_config.json``
alone (no transformers), capped by the spec's ``image_max_tokens``: the ingress counts a
request's visual tokens with it from the sizes the images' headers declare, before any
decode (``blitz.ingress.parts``). ``VisualProcessor`` is the folder's own image processor
(transformers' PIL one: the torchvision one cannot be installed beside a CPU torch), with
the same cap, giving each decoded image's ``VisualInput``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ImageShape:
    """How a model resizes and patches an image."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @property
    def factor(self) -> int:
        """Each resized side is a multiple of this many pixels (one token's side)."""
        return self.patch_size * self.merge_size

    def tokens(self, width: int, height: int) -> int:
        """The visual tokens an image of ``width x height`` pixels takes."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return (h // self.factor) * (w // self.factor)

    def capped(self, max_tokens: int | None, min_tokens: int | None) -> ImageShape:
        """This shape with at most ``max_tokens`` (at least ``min_tokens``) per image."""
        area = self.factor ** 2
        high = self.max_pixels if max_tokens is None else min(self.max_pixels,
                                                               max_tokens * area)
        low = self.min_pixels if min_tokens is None else max(self.min_pixels,
                                                             min_tokens * area)
        return ImageShape(self.patch_size, self.merge_size, self.temporal_patch_size,
                          min(low, high), high)


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """(height, width) once resized: sides multiples of ``factor``, the area within
    ``[min_pixels, max_pixels]``, the aspect ratio kept as closely as that allows
    (transformers' ``smart_resize`` for Qwen2-VL; an aspect over 200 is refused where the
    image is decoded, ``VisualProcessor.prepare``)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def read_image_shape(folder: Path) -> ImageShape:
    """The resize rule in ``folder``'s ``preprocessor_config.json`` (defaults: Qwen2-VL's),
    read without transformers."""
    path = folder / "preprocessor_config.json"
    config: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    size = config.get("size") or {}
    default = ImageShape()
    return ImageShape(
        int(config.get("patch_size") or default.patch_size),
        int(config.get("merge_size") or default.merge_size),
        int(config.get("temporal_patch_size") or default.temporal_patch_size),
        int(config.get("min_pixels") or size.get("shortest_edge") or default.min_pixels),
        int(config.get("max_pixels") or size.get("longest_edge") or default.max_pixels))


@dataclass(frozen=True, eq=False)
class VisualInput:
    """One image as the model's input: its patches (``patches x channels*t*p*p``, float32)
    and its patch grid (t, h, w)."""

    pixel_values: np.ndarray
    grid: tuple[int, int, int]
    merge_size: int

    @property
    def tokens(self) -> int:
        t, h, w = self.grid
        return t * h * w // self.merge_size ** 2


class VisualProcessor:
    """The model folder's image processor, capped at ``shape``'s pixels."""

    def __init__(self, folder: Path, shape: ImageShape):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.shape = shape
        self.processor = Qwen2VLImageProcessorPil.from_pretrained(
            str(folder), size={"shortest_edge": shape.min_pixels,
                               "longest_edge": shape.max_pixels})

    def prepare(self, image: Any) -> VisualInput:
        """A decoded image (``PIL.Image``, RGB) as the model's input."""
        width, height = image.size
        if max(width, height) > 200 * max(1, min(width, height)):
            from blitz.errors import InvalidValue

            raise InvalidValue(f"an image of {width}x{height} pixels: its aspect ratio is "
                               "over 200", param="images")
        out = self.processor(images=[image], return_tensors="np")
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"])[0])
        return VisualInput(np.ascontiguousarray(out["pixel_values"], dtype=np.float32),
                           (grid[0], grid[1], grid[2]), self.shape.merge_size)
