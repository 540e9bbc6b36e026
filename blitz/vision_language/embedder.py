"""A vision-language embedder (Qwen3-VL-Embedding, GME): a text, an image, or an ordered
mix of both into one vector, by the model card's formula.

Each input is a chat: a system turn holding the instruction (the request's, else the
spec's ``vl_instruction``, else "Represent the user's input."; one that does not end in
punctuation gets a full stop, as the model card's code does), a user turn holding the
input's parts in order (an image as the template's vision slot), and the generation
prompt, rendered by the model's own chat template (``blitz.vision_language.sequence``).
The vector is the last token's hidden state, normalized on request; ``dimensions`` keeps
its first N (Matryoshka) on the way out, as for every embedding. An input with no part
is the model card's ``NULL`` text. An over-long input loses the end of its texts, never
an image.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, l2_normalize
from blitz.settings.registry import ModelSpec
from blitz.vision_language.decoder import Document, VlDecoder, open_decoder
from blitz.vision_language.sequence import Piece, caller_text, chat_pieces
from blitz.vision_language.visual import ImageShape, read_image_shape

DEFAULT_INSTRUCTION = "Represent the user's input."


def instruction_text(instruction: str | None, default: str = DEFAULT_INSTRUCTION) -> str:
    """The system turn's text: ``instruction`` stripped and ended in punctuation."""
    text = (instruction or "").strip() or default
    if not unicodedata.category(text[-1]).startswith("P"):
        text += "."
    return text


class VlEmbedder(VlDecoder):
    kind = "vl-embedding"
    capabilities = frozenset({"embed", "score", "embed_images", "embed_parts"})

    def __init__(self, model_id: str, model: Any, tokenizer: Any, folder: Path,
                 shape: ImageShape, *, instruction: str | None = None,
                 max_seq_length: int | None = None, token_budget: int = 4096):
        super().__init__(model_id, model, tokenizer, folder, shape,
                         max_seq_length=max_seq_length, token_budget=token_budget)
        self.instruction = instruction_text(instruction)

    @property
    def dimension(self) -> int:
        return self.hidden_size

    def prompt(self, pieces: list[Piece], instruction: str | None) -> list[Piece]:
        text = self.instruction if instruction is None else instruction_text(instruction)
        with self._lock:
            return chat_pieces(self.tokenizer, [
                {"role": "system", "content": [caller_text(text)]},
                {"role": "user", "content": pieces or [caller_text("NULL")]}])

    def embed_parts(self, documents: list[Document], *, normalize: bool,
                    instruction: str | None = None, truncate: bool = True) -> Encoded:
        """One vector per document (its texts and images, in order)."""
        prompts = [self.prompt(self.parts(doc, i, cut=0), instruction)
                   for i, doc in enumerate(documents)]
        sequences = self.sequences(prompts, truncate)
        values, padded = self.last_states(sequences)
        counts = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        return Encoded(l2_normalize(values) if normalize else values, counts, padded)

    def warmup(self) -> None:
        """A text and a text with an image: both paths' lazy setup done before a request."""
        self.embed_parts([("warm up",), ("warm up", self.blank_image())], normalize=True)

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        return self.embed_parts([(t,) for t in texts], normalize=normalize, truncate=truncate)

    def prepare_images(self, images: list[Any]) -> list[Any]:
        return [self.prepare_part(picture) for picture in images]

    def embed_prepared(self, prepared: Any, *, normalize: bool) -> Encoded:
        return self.embed_parts([(v,) for v in prepared], normalize=normalize)

    def embed_image_bytes(self, images: list[bytes], *, normalize: bool) -> Encoded:
        return self.embed_parts([(data,) for data in images], normalize=normalize)


def open_vl_embedder(spec: ModelSpec, path: Path, device: str, dtype: Any,
                     token_budget: int) -> VlEmbedder:
    """``spec``'s vision-language embedder in ``path`` on ``device`` in ``dtype``."""
    model, tokenizer = open_decoder(path, device, dtype, spec.trust_remote_code)
    shape = read_image_shape(path).capped(spec.image_max_tokens, spec.image_min_tokens)
    return VlEmbedder(spec.id, model, tokenizer, path, shape, instruction=spec.vl_instruction,
                      max_seq_length=spec.max_seq_length, token_budget=token_budget)
