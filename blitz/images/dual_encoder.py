"""A dual encoder (CLIP, SigLIP): texts and images into one space, each side its model's
own projection (``get_text_features``, ``get_image_features``), normalized on request.

Rows are independent on both sides (the text tower's mask keeps padding out, the vision
tower sees fixed-size pixels), so a text or an image gets the same vector alone or in any
batch. Images arrive decoded (``blitz.images.decode``); the model's own image processor
resizes and normalizes them, off the model call's critical path when the caller runs
``pixels`` ahead of ``embed_pixels``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder
from blitz.images.decode import ImageLimits, decode


class DualEncoder(Encoder):
    kind = "dual-encoder"

    def __init__(self, model_id: str, path: str | Path, device: str = "cpu",
                 max_seq_length: int | None = None, dtype: Any = None):
        import torch
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        self._torch = torch
        self.model = AutoModel.from_pretrained(str(path), torch_dtype=dtype).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.processor = AutoImageProcessor.from_pretrained(str(path))
        text = self.model.config.text_config
        longest = max_seq_length or min(int(text.max_position_embeddings),
                                        int(self.tokenizer.model_max_length))
        super().__init__(model_id, longest)
        self.device = device
        self.limits = ImageLimits()  # the pool's image limits, set by the loader
        self._dimension = int(getattr(self.model.config, "projection_dim", 0)
                              or text.hidden_size)
        # SigLIP's text tower pools the last position: its texts are padded to a fixed
        # length, as it was trained (transformers' docs: padding="max_length")
        self._fixed_length = type(self.model).__name__.startswith("Siglip")

    @property
    def dimension(self) -> int | None:
        return self._dimension

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        batch = self.tokenizer(texts, padding="max_length" if self._fixed_length else True,
                               truncation=truncate, max_length=self.max_seq_length,
                               return_tensors="pt")
        with self._torch.inference_mode():
            values = self.model.get_text_features(
                **{k: v.to(self.device) for k, v in batch.items()
                   if k in ("input_ids", "attention_mask")})
        counts = batch["attention_mask"].sum(dim=1).numpy().astype(np.int64)
        return Encoded(_rows(values, normalize), counts,
                       padded_tokens=int(batch["input_ids"].numel()))

    def warmup(self) -> None:
        """Both towers once: the first text and the first image pay no lazy setup."""
        from PIL import Image

        self.embed(["warm up"], normalize=True)
        self.embed_images([Image.new("RGB", (64, 64))], normalize=True)

    def pixels(self, images: list[Any]) -> Any:
        """Decoded images as the model's input tensor (resized, normalized)."""
        return self.processor(images=images, return_tensors="pt")["pixel_values"]

    def prepare_images(self, images: list[Any]) -> Any:
        return self.pixels(images)

    def embed_prepared(self, prepared: Any, *, normalize: bool) -> Encoded:
        return self.embed_pixels(prepared, normalize=normalize)

    def embed_pixels(self, pixels: Any, *, normalize: bool) -> Encoded:
        with self._torch.inference_mode():
            values = self.model.get_image_features(
                pixel_values=pixels.to(self.device, self.model.dtype))
        return Encoded(_rows(values, normalize), np.zeros(len(values), dtype=np.int64))

    def embed_images(self, images: list[Any], *, normalize: bool) -> Encoded:
        return self.embed_pixels(self.pixels(images), normalize=normalize)

    def embed_image_bytes(self, images: list[bytes], *, normalize: bool) -> Encoded:
        """Encoded images decoded within ``limits`` (a bad one: its 4xx, naming its index
        in the job), then embedded."""
        decoded = [decode(data, self.limits, param=f"images[{i}]")
                   for i, data in enumerate(images)]
        return self.embed_images(decoded, normalize=normalize)


def _rows(values: Any, normalize: bool) -> np.ndarray:
    if not hasattr(values, "float"):  # transformers 5 may answer an output object
        values = values.pooler_output
    out = values.float().cpu().numpy().astype(np.float32)
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out
