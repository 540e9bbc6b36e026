"""A dual encoder (CLIP, SigLIP) on onnxruntime: each tower its own ONNX graph.

``export_towers`` writes the two graphs from a torch ``DualEncoder``: the text tower
(``input_ids``, ``attention_mask`` -> what ``get_text_features`` returns) and the vision
tower (``pixel_values`` -> what ``get_image_features`` returns), batch and sequence
dynamic. ``OnnxDualEncoder`` runs them with the folder's own tokenizer and image processor,
called exactly as the torch encoder calls them (``DualEncoderBase``), so the two backends
differ only in the towers. Builds, int8 quantization, the cache and the accuracy guard are
the loader's (``blitz.loading.dual_export``); ``probe_images`` is the guard's image probe
set.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from blitz.images.dual_encoder import DualEncoder, DualEncoderBase
from blitz.runtime import model_threads

TEXT_GRAPH = "onnx/text.onnx"
VISION_GRAPH = "onnx/vision.onnx"
OPSET = 17
TEXT_INPUTS = ("input_ids", "attention_mask")
PROBE_IMAGE_SIDES = ((64, 64), (96, 48), (40, 120), (224, 224), (33, 31), (160, 90))


class OnnxDualEncoder(DualEncoderBase):
    """The two towers' graphs (in ``graphs``) on onnxruntime, the preprocessing from the
    model's folder ``path`` (CPU)."""

    tensors = "np"

    def __init__(self, model_id: str, path: str | Path, graphs: str | Path,
                 text_file: str = TEXT_GRAPH, image_file: str = VISION_GRAPH,
                 max_seq_length: int | None = None):
        from transformers import AutoConfig

        super().__init__(model_id, path, AutoConfig.from_pretrained(str(path)), max_seq_length)
        self.device = "cpu"
        self.text_session: Any = model_threads.onnx_session(Path(graphs) / text_file)
        self.image_session: Any = model_threads.onnx_session(Path(graphs) / image_file)
        self._text_inputs = {i.name for i in self.text_session.get_inputs()}

    def text_features(self, input_ids: Any, attention_mask: Any) -> np.ndarray:
        feed = {"input_ids": np.asarray(input_ids, dtype=np.int64),
                "attention_mask": np.asarray(attention_mask, dtype=np.int64)}
        # a tower that ignores its mask (padding "max_length") may have no mask input
        session = self._open(self.text_session)
        return session.run(None, {k: v for k, v in feed.items() if k in self._text_inputs})[0]

    def image_features(self, pixels: Any) -> np.ndarray:
        session = self._open(self.image_session)
        return session.run(None, {"pixel_values": np.asarray(pixels, dtype=np.float32)})[0]

    def _open(self, session: Any) -> Any:
        if session is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        return session

    def close(self) -> None:
        self.text_session = self.image_session = None


def export_towers(encoder: DualEncoder, directory: Path) -> tuple[str, str]:
    """``encoder``'s towers (torch, fp32, CPU) as ONNX graphs under ``directory``; returns
    their files relative to it (``TEXT_GRAPH``, ``VISION_GRAPH``)."""
    import torch

    model = encoder.model
    batch = encoder.tokens(["a photo of a cat", "two dogs running on a sunny beach"])
    pixels = encoder.pixels(probe_images()[:2])
    (directory / TEXT_GRAPH).parent.mkdir(parents=True, exist_ok=True)
    rows = {0: "batch"}
    text, vision = (_tower(model, "get_text_features", TEXT_INPUTS),
                    _tower(model, "get_image_features", ("pixel_values",)))
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the tracer's constants, the exporter's deprecation
        torch.onnx.export(
            text, (batch["input_ids"], batch["attention_mask"]),
            str(directory / TEXT_GRAPH), input_names=list(TEXT_INPUTS),
            output_names=["text_embeds"], opset_version=OPSET, dynamo=False,
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"}, "text_embeds": rows})
        torch.onnx.export(
            vision, (pixels.to(torch.float32),),
            str(directory / VISION_GRAPH), input_names=["pixel_values"],
            output_names=["image_embeds"], opset_version=OPSET, dynamo=False,
            dynamic_axes={"pixel_values": rows, "image_embeds": rows})
    return TEXT_GRAPH, VISION_GRAPH


def _tower(model: Any, method: str, names: tuple[str, ...]) -> Any:
    """``model.<method>`` (a projection) as a module the exporter traces: ``model`` a
    submodule, so its weights are the graph's initializers (what int8 quantizes)."""
    import torch

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            values = getattr(self.model, method)(**dict(zip(names, inputs, strict=True)))
            return values if hasattr(values, "float") else values.pooler_output

    return Tower().eval()


def probe_images() -> list[Any]:
    """The accuracy guard's probe images: deterministic and synthetic (no files), of
    varied sizes and aspect ratios so the processor resizes and crops them: noise,
    gradients, stripes, a checkerboard, a disc, blocks of colour."""
    from PIL import Image

    rng = np.random.default_rng(47)
    out = []
    for i, (width, height) in enumerate(PROBE_IMAGE_SIDES):
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        u, v = x / max(width - 1, 1), y / max(height - 1, 1)
        channels = [
            (u, v, 1 - u),  # gradients
            (np.sin(12 * u) * 0.5 + 0.5, (x // 8 + y // 8) % 2, v),  # stripes, checkerboard
            (((u - 0.5) ** 2 + (v - 0.5) ** 2 < 0.1) * 1.0, u * v, 0.3 + 0 * u),  # a disc
        ][i % 3]
        pattern = np.stack([np.broadcast_to(c, (height, width)) for c in channels], axis=-1)
        noise = rng.random((height, width, 3), dtype=np.float32)
        mix = 0.25 + 0.5 * (i / len(PROBE_IMAGE_SIDES))  # from mostly pattern to mostly noise
        pixels = (1 - mix) * pattern + mix * noise
        out.append(Image.fromarray((pixels * 255).clip(0, 255).astype(np.uint8), "RGB"))
    return out
