"""A dual encoder (CLIP, SigLIP): texts and images into one space, each side its model's
own projection (``get_text_features``, ``get_image_features``), normalized on request.

Rows are independent on both sides (the text tower's mask keeps padding out, the vision
tower sees fixed-size pixels), so a text or an image gets the same vector alone or in any
batch. Images arrive decoded (``blitz.images.decode``); the model's own image processor
resizes and normalizes them, off the model call's critical path when the caller runs
``pixels`` ahead of ``embed_pixels``.

``DualEncoderBase`` is what every backend shares: the folder's tokenizer and image
processor, called the same way, and the rows made of what the towers answer.
``DualEncoder`` runs the towers on torch; ``blitz.images.onnx_dual.OnnxDualEncoder`` on
onnxruntime.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder
from blitz.images.decode import ImageLimits, decode


class DualEncoderBase(Encoder):
    """A dual encoder's inputs and outputs; a backend runs the two towers."""

    kind = "dual-encoder"
    capabilities = frozenset({"embed", "score", "embed_images"})
    tensors = "pt"  # what the tokenizer and image processor return: "pt" or "np"

    def __init__(self, model_id: str, path: str | Path, config: Any,
                 max_seq_length: int | None = None):
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.processor = AutoImageProcessor.from_pretrained(str(path))
        text = config.text_config
        longest = max_seq_length or min(int(text.max_position_embeddings),
                                        int(self.tokenizer.model_max_length))
        super().__init__(model_id, longest)
        self.limits = ImageLimits()  # the pool's images settings, once loaded (configure)
        self._dimension = int(getattr(config, "projection_dim", 0) or text.hidden_size)
        # SigLIP's text tower pools the last position: its texts are padded to a fixed
        # length, as it was trained (transformers' docs: padding="max_length")
        self._fixed_length = str(config.model_type).startswith("siglip")

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,
                  images: Any) -> None:
        self.limits = images

    @property
    def dimension(self) -> int | None:
        return self._dimension

    @abstractmethod
    def text_features(self, input_ids: Any, attention_mask: Any) -> np.ndarray:
        """The text tower's projections (``get_text_features``), float32, unnormalized."""

    @abstractmethod
    def image_features(self, pixels: Any) -> np.ndarray:
        """The vision tower's projections (``get_image_features``), float32, unnormalized."""

    def tokens(self, texts: list[str], truncate: bool = True) -> Any:
        """``texts`` as the text tower takes them (``input_ids``, ``attention_mask``)."""
        return self.tokenizer(texts, padding="max_length" if self._fixed_length else True,
                              truncation=truncate, max_length=self.max_seq_length,
                              return_tensors=self.tensors)

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        batch = self.tokens(texts, truncate)
        values = self.text_features(batch["input_ids"], batch["attention_mask"])
        counts = np.asarray(batch["attention_mask"]).sum(axis=1).astype(np.int64)
        return Encoded(_rows(values, normalize), counts,
                       padded_tokens=int(np.asarray(batch["input_ids"]).size))

    def warmup(self) -> None:
        """Both towers once: the first text and the first image pay no lazy setup."""
        from PIL import Image

        self.embed(["warm up"], normalize=True)
        self.embed_images([Image.new("RGB", (64, 64))], normalize=True)

    def pixels(self, images: list[Any]) -> Any:
        """Decoded images as the model's input tensor (resized, normalized)."""
        return self.processor(images=images, return_tensors=self.tensors)["pixel_values"]

    def prepare_images(self, images: list[Any]) -> Any:
        return self.pixels(images)

    def embed_prepared(self, prepared: Any, *, normalize: bool) -> Encoded:
        """``prepare_images``' output, or a list of its rows (one per image: a job prepared
        image by image, ``blitz.pool.image_prep``)."""
        if isinstance(prepared, list):
            prepared = self._stacked(prepared)
        return self.embed_pixels(prepared, normalize=normalize)

    def _stacked(self, rows: list[Any]) -> Any:
        if self.tensors == "np":
            return np.stack([np.asarray(row) for row in rows])
        import torch

        return torch.stack(rows)

    def embed_pixels(self, pixels: Any, *, normalize: bool) -> Encoded:
        values = self.image_features(pixels)
        return Encoded(_rows(values, normalize), np.zeros(len(values), dtype=np.int64))

    def embed_images(self, images: list[Any], *, normalize: bool) -> Encoded:
        return self.embed_pixels(self.pixels(images), normalize=normalize)

    def embed_image_bytes(self, images: list[bytes], *, normalize: bool) -> Encoded:
        """Encoded images decoded within ``limits`` (a bad one: its 4xx, naming its index
        in the job) and resized one at a time (each full-size image closed once it is the
        model's input size), then embedded."""
        rows: list[Any] = []
        for i, data in enumerate(images):
            image = decode(data, self.limits, param=f"images[{i}]")
            try:
                rows.extend(self.pixels([image]))
            finally:
                image.close()
        return self.embed_prepared(rows, normalize=normalize)


class DualEncoder(DualEncoderBase):
    """The towers on torch (the accuracy guard's reference in fp32)."""

    def __init__(self, model_id: str, path: str | Path, device: str = "cpu",
                 max_seq_length: int | None = None, dtype: Any = None):
        import torch
        from transformers import AutoModel

        self._torch = torch
        self.model = AutoModel.from_pretrained(str(path), dtype=dtype).to(device).eval()
        super().__init__(model_id, path, self.model.config, max_seq_length)
        self.device = device

    def text_features(self, input_ids: Any, attention_mask: Any) -> np.ndarray:
        with self._torch.inference_mode():
            return _floats(self.model.get_text_features(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device)))

    def image_features(self, pixels: Any) -> np.ndarray:
        with self._torch.inference_mode():
            return _floats(self.model.get_image_features(
                pixel_values=pixels.to(self.device, self.model.dtype)))

    def close(self) -> None:
        self.__dict__.pop("model", None)


def _floats(values: Any) -> np.ndarray:
    if not hasattr(values, "float"):  # transformers 5 may answer an output object
        values = values.pooler_output
    return values.float().cpu().numpy().astype(np.float32)


def _rows(values: np.ndarray, normalize: bool) -> np.ndarray:
    out = np.asarray(values, dtype=np.float32).copy()
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out
