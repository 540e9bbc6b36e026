"""What a vision-language embedder and reranker share: the decoder (Qwen2-VL, Qwen3-VL)
run on sequences of text and image tokens, answering each sequence's last hidden state.

A document is a tuple of parts, in order: a text (``str``), an image's encoded bytes
(decoded here within the ``images:`` limits, one at a time, each full-size image closed
once processed) or an image processed ahead of the queue (``VisualInput``,
``blitz.pool.image_prep``). Sequences run sorted by length in micro-batches of at most
``token_budget`` padded tokens (visual tokens included; one longer runs alone), padded on
the left, so the last position is every row's last token. The model computes each row's
multimodal positions from its own tokens (the attention mask and ``mm_token_type_ids``);
a text-only row's positions are shifted by its padding, which rotary positions do not
see: a row's vector does not depend on what it was batched with.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoder, by_length
from blitz.errors import InvalidValue
from blitz.images.decode import ImageLimits, decode
from blitz.runtime import model_threads
from blitz.vision_language.sequence import Piece, Sequence, SequenceBuilder, caller_text, image
from blitz.vision_language.visual import ImageShape, VisualInput, VisualProcessor

logger = logging.getLogger("blitz.encoders")

Part = str | bytes | VisualInput
"""One part of a document: a text, an encoded image, or an image processed."""
Document = tuple[Part, ...]
DEFAULT_MAX_LENGTH = 8192  # tokens, when neither the spec nor a shorter model says


class VlDecoder(Encoder):
    """A vision-language decoder's tokenizer, image processor and forward pass."""

    out_width = 0  # what a row of ``head`` holds (0: the hidden size)

    def __init__(self, model_id: str, model: Any, tokenizer: Any, folder: Path,
                 shape: ImageShape, *, max_seq_length: int | None, token_budget: int):
        text = getattr(model.config, "text_config", None) or model.config
        positions = getattr(text, "max_position_embeddings", None) or DEFAULT_MAX_LENGTH
        super().__init__(model_id, max_seq_length or min(DEFAULT_MAX_LENGTH, int(positions)))
        self.model = model
        self.tokenizer = tokenizer
        self.device = str(model.device)
        self.hidden_size = int(text.hidden_size)
        self.builder = SequenceBuilder(tokenizer)
        self.visual = VisualProcessor(folder, shape)
        self.token_budget = token_budget
        self.limits = ImageLimits()  # the pool's images: settings, once loaded (configure)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id or 0)
        # a fast tokenizer is not shared between threads; the model runs calls at once
        self._lock = threading.Lock()

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,
                  images: Any) -> None:
        self.token_budget = max_batch_tokens  # the pool's memory budget allows this many
        self.limits = images

    # ---- images ------------------------------------------------------------------------

    def prepare_part(self, picture: Any) -> VisualInput:
        """A decoded image (a document's part) as the model's input: run off the model
        call's thread (``blitz.pool.image_prep``)."""
        return self.visual.prepare(picture)

    def blank_image(self) -> VisualInput:
        """A small blank image as the model's input: what a warm-up sends, so the first
        request with an image pays no lazy setup of the vision tower."""
        from PIL import Image

        return self.prepare_part(Image.new("RGB", (64, 64)))

    def _visual(self, part: bytes, param: str) -> VisualInput:
        picture = decode(part, self.limits, param=param)
        try:
            return self.visual.prepare(picture)
        finally:
            picture.close()

    def parts(self, document: Document, index: int, cut: int = -1) -> list[Piece]:
        """A document's parts as prompt pieces (its images decoded if they are bytes);
        ``cut``: its texts' rank when a sequence is cut."""
        pieces: list[Piece] = []
        for j, part in enumerate(document):
            if isinstance(part, str):
                pieces.append(caller_text(part, cut))
            elif isinstance(part, VisualInput):
                pieces.append(image(part))
            elif isinstance(part, (bytes, bytearray, memoryview)):
                pieces.append(image(self._visual(bytes(part), f"inputs[{index}][{j}]")))
            else:
                raise InvalidValue(f"inputs[{index}][{j}] must be a text or an image, not "
                                   f"{type(part).__name__}", param="input")
        return pieces

    # ---- the model call -------------------------------------------------------------------

    def sequences(self, prompts: list[list[Piece]], truncate: bool) -> list[Sequence]:
        with self._lock:
            return [self.builder.build(pieces, self.max_seq_length, truncate, i)
                    for i, pieces in enumerate(prompts)]

    def last_states(self, sequences: list[Sequence]) -> tuple[np.ndarray, int]:
        """Each sequence's last hidden state (float32, rows in order), and the tokens the
        model computed, padding included."""
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        out = np.empty((len(sequences), self.out_width or self.hidden_size), dtype=np.float32)
        padded = 0
        for rows in by_length([len(s) for s in sequences], self.token_budget):
            out[rows] = self._forward([sequences[i] for i in rows])
            padded += len(rows) * len(sequences[rows[-1]])
        return out, padded

    def _forward(self, batch: list[Sequence]) -> np.ndarray:
        """One model call on left-padded ``batch``: each row's last hidden state."""
        torch = model_threads.torch_module()
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, sequence in enumerate(batch):
            ids[row, width - len(sequence):] = torch.tensor(sequence.ids, dtype=torch.long)
            mask[row, width - len(sequence):] = 1
        extra: dict[str, Any] = {}
        images = [v for s in batch for v in s.images]
        if images:  # in the order of their tokens, row by row
            extra["pixel_values"] = torch.from_numpy(np.concatenate(
                [v.pixel_values for v in images])).to(self.device, self.model.dtype)
            extra["image_grid_thw"] = torch.tensor([v.grid for v in images],
                                                   dtype=torch.long).to(self.device)
            # which tokens are an image's (transformers' multimodal positions read them)
            extra["mm_token_type_ids"] = (ids == self.builder.image_pad).int().to(self.device)
        with torch.inference_mode():
            states = self.model(input_ids=ids.to(self.device),
                                attention_mask=mask.to(self.device), use_cache=False,
                                **extra).last_hidden_state[:, -1, :]
            return self.head(states).float().cpu().numpy()

    def head(self, states: Any) -> Any:
        """What the model answers of the last hidden states (an embedder: themselves)."""
        return states

    def close(self) -> None:
        self.model = None


def open_decoder(path: Path, device: str, dtype: Any, trust_remote_code: bool
                 ) -> tuple[Any, Any]:
    """The base decoder (transformers' ``AutoModel``: ``Qwen2VLModel``, ``Qwen3VLModel``)
    and the tokenizer in ``path``."""
    model_threads.torch_module()
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model: Any = AutoModel.from_pretrained(str(path), dtype=dtype,
                                           trust_remote_code=trust_remote_code)
    if device == "cpu":
        logger.warning("vision-language model in %s runs on the CPU: expect seconds per "
                       "image at 2B parameters (docs/models.md, \"Vision-language models\"); "
                       "a GPU pool serves it where there is one", path)
    return model.to(device).eval(), tokenizer
