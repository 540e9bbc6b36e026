"""Visual document retrievers (kind vl-multi-vector): ColPali and ColQwen2 as transformers
ships them (``ColPaliForRetrieval``, ``ColQwen2ForRetrieval``): a page image or a text
query becomes one vector per token, projected, normalized and masked by the model itself,
and a query scores a page by MaxSim.

The folder's own processor renders the prompts ("Query: " and its ten augmentation tokens;
the visual prompt with its image tokens) with its PIL image processor, so no torchvision is
needed. A page is decoded and resized to the processor's own size before the queue
(``prepare_part``: the processor makes the same pixels of it as of the full page), so a
job holds small images; the processor's patching runs in the model call. Texts are queries
(as sentence-transformers renders them for these models).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder, MultiVectorReduce
from blitz.encoders.colbert import reduced
from blitz.errors import InputTooLong, InvalidValue
from blitz.multivector import muvera
from blitz.runtime import model_threads
from blitz.vision_language.visual import smart_resize

PROMPT_TOKENS = 32  # room for a query's prefix, augmentation and specials, and a page's prompt


class ColVisionEncoder(Encoder):
    """A ``*ForRetrieval`` model and its processor, on one device."""

    kind = "vl-multi-vector"
    capabilities = frozenset({"embed_multi", "score"})

    def __init__(self, model_id: str, model: Any, processor: Any, *, device: str,
                 token_budget: int, max_seq_length: int | None = None):
        super().__init__(model_id, max_seq_length or 512)
        self.model = model
        self.processor = processor
        self.device = device
        self.token_budget = token_budget
        self._dimension = int(model.config.embedding_dim)
        self._lock = threading.Lock()  # the processor's tokenizer is not reentrant
        ip = processor.image_processor
        size = getattr(ip, "size", None) or {}
        self._fixed = ((int(size["height"]), int(size["width"]))
                       if size.get("height") and size.get("width") else None)
        merge = int(getattr(ip, "merge_size", 1) or 1)
        self._factor = int(getattr(ip, "patch_size", 14) or 14) * merge
        self._pixels = (int(size.get("shortest_edge") or getattr(ip, "min_pixels", 0) or 3136),
                        int(size.get("longest_edge") or getattr(ip, "max_pixels", 0)
                            or 28 * 28 * 1280))
        self._image_tokens = int(getattr(processor, "image_seq_length", 0) or 0)

    @property
    def dimension(self) -> int:
        return self._dimension

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,
                  images: Any) -> None:
        self.token_budget = max_batch_tokens

    def target(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the processor resizes a page of this size to."""
        if self._fixed is not None:
            return self._fixed[1], self._fixed[0]
        h, w = smart_resize(height, width, self._factor, *self._pixels)
        return w, h

    def page_tokens(self, width: int, height: int) -> int:
        """A page's image tokens (the vectors it gives, besides its prompt's)."""
        if self._fixed is not None:
            return self._image_tokens or (self._fixed[0] // 14) * (self._fixed[1] // 14)
        w, h = self.target(width, height)
        return (w // self._factor) * (h // self._factor)

    def prepare_part(self, picture: Any) -> Any:
        """A decoded page, RGB, resized to the processor's own size (bicubic, as the
        processor resizes: it then makes the same pixels of it as of the full page)."""
        from PIL import Image

        rgb = picture.convert("RGB")
        size = self.target(*rgb.size)
        return rgb if rgb.size == size else rgb.resize(size, Image.Resampling.BICUBIC)

    def _cut(self, texts: list[str], truncate: bool) -> list[str]:
        """Queries within max_seq_length tokens with their prompt: cut at a token
        boundary, or a 413 with ``truncate`` False."""
        room = self.max_seq_length - PROMPT_TOKENS
        tokenizer = self.processor.tokenizer
        out = []
        for i, text in enumerate(texts):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > room:
                if not truncate:
                    raise InputTooLong.at(i, len(ids) + PROMPT_TOKENS, self.max_seq_length)
                text = tokenizer.decode(ids[:room])
            out.append(text)
        return out

    def _run(self, batch: Any) -> list[np.ndarray]:
        torch = model_threads.torch_module()
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        batch = {k: v.to(self.device) for k, v in batch.items() if k != "labels"}
        with torch.inference_mode():
            out = self.model(**batch).embeddings.float()
        mask = batch["attention_mask"].bool()
        return [row[m].cpu().numpy().astype(np.float32) for row, m in zip(out, mask,
                                                                         strict=True)]

    def _queries(self, texts: list[str]) -> list[np.ndarray]:
        rows: list[np.ndarray] = []
        step = max(1, self.token_budget // self.max_seq_length)
        for start in range(0, len(texts), step):
            with self._lock:
                batch = self.processor.process_queries(texts[start:start + step])
            rows += self._run(batch)
        return rows

    def _pages(self, pages: list[Any]) -> list[np.ndarray]:
        rows: list[np.ndarray] = []
        start = 0
        while start < len(pages):  # as many pages as the token budget holds, at least one
            end, tokens = start, 0
            while end < len(pages):
                cost = self.page_tokens(*pages[end].size) + PROMPT_TOKENS
                if end > start and tokens + cost > self.token_budget:
                    break
                tokens += cost
                end += 1
            with self._lock:
                batch = self.processor.process_images(pages[start:end])
            rows += self._run(batch)
            start = end
        return rows

    def embed_multi(self, texts: list[str], *, query: bool, truncate: bool = True,
                    reduce: MultiVectorReduce | None = None,
                    images: list[Any] | None = None) -> Encoded:
        """Pages (``images``, prepared) as documents, or texts as queries."""
        reduce = reduce or MultiVectorReduce()
        if images:
            pages = [p if not isinstance(p, bytes) else self._decoded(p) for p in images]
            rows = self._pages(pages)
        else:
            rows = self._queries(self._cut(texts, truncate))
        counts = np.array([len(r) for r in rows], dtype=np.int64)
        return reduced(rows, counts, query=not images, reduce=reduce,
                       dimension=self._dimension, protected=0)

    def _decoded(self, data: bytes) -> Any:
        """An encoded page decoded here (a job that came without preparing)."""
        from blitz.images.decode import decode
        from blitz.settings.images import ImageSettings

        picture = decode(data, ImageSettings(), "images")
        try:
            return self.prepare_part(picture)
        finally:
            picture.close()

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        """Texts scored by MaxSim against ``query``; both rendered as queries (what these
        models make of text)."""
        rows = self._queries(self._cut([query, *documents], truncate))
        scores = muvera.maxsim(rows[0], rows[1:]).astype(np.float32)
        counts = np.array([len(r) for r in rows], dtype=np.int64)
        return Encoded(scores, counts[1:] + counts[0], int(counts.sum()))

    def warmup(self) -> None:
        from PIL import Image

        self.embed_multi([], query=False, images=[self.prepare_part(Image.new("RGB",
                                                                              (64, 64)))])
        self.score("warm up", ["warm up"])

    def close(self) -> None:
        self.model = None


RETRIEVERS = ("ColPaliForRetrieval", "ColQwen2ForRetrieval")


def open_col_retriever(model_id: str, path: Path, *, device: str, dtype: Any,
                       token_budget: int, max_seq_length: int | None,
                       trust_remote_code: bool) -> ColVisionEncoder:
    """A ColPali or ColQwen2 folder (transformers' ``*ForRetrieval``) on ``device``."""
    import json

    config = json.loads((path / "config.json").read_text())
    architectures = config.get("architectures") or []
    if not any(name in RETRIEVERS for name in architectures):
        raise InvalidValue(f"model {model_id!r}: a vl-multi-vector folder holds one of "
                           f"{', '.join(RETRIEVERS)} (its config.json names {architectures})",
                           param="model")
    model_threads.torch_module()
    from transformers import AutoModelForPreTraining, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model = AutoModelForPreTraining.from_pretrained(
        str(path), dtype=dtype, trust_remote_code=trust_remote_code).to(device).eval()
    return ColVisionEncoder(model_id, model, processor, device=device,
                            token_budget=token_budget, max_seq_length=max_seq_length)
