"""The models' tokenizers on the ingress, one per model id, opened on first use.

Each is the model folder's ``tokenizer.json`` on the ``tokenizers`` library (a folder
without one is converted once through transformers' fast tokenizer), loaded off the event
loop on a model's first request, once per model id (registry ids only: their number bounds
what is held), untruncated and unpadded. ``/tokenize`` and ``/decode``
(``blitz.ingress.tokenizing``) answer with them, and the cost budget counts with them
(``blitz.ingress.long_inputs``, ``blitz.ingress.other_outputs``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blitz.errors import InvalidValue, LoadProblem, ModelLoadFailed
from blitz.loading.fetch import resolve_source
from blitz.settings.registry import ModelSpec


class NoTokenizer(LoadProblem):
    """The model has no tokenizer to show (a fake model), or its files have none."""


def open_tokenizer(folder: Path) -> Any:
    """``folder``'s fast tokenizer (a ``tokenizers.Tokenizer``), untruncated and unpadded."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if path.is_file():
        tokenizer = Tokenizer.from_file(str(path))
    else:  # a slow tokenizer's files: transformers converts them once
        try:
            from transformers import AutoTokenizer

            converted = AutoTokenizer.from_pretrained(str(folder), use_fast=True)
        except Exception as exc:
            raise NoTokenizer(f"no tokenizer in the model's files ({type(exc).__name__})") \
                from exc
        if not getattr(converted, "is_fast", False):
            raise NoTokenizer("the model's tokenizer has no fast version")
        tokenizer = converted.backend_tokenizer
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


class Tokenizers:
    """One tokenizer per model id, opened on first use (``open_folder(model_id)`` gives its
    folder). A failed open is not remembered: the next request tries again."""

    def __init__(self, open_folder: Callable[[str], Path]):
        self._open_folder = open_folder
        self._held: dict[str, Any] = {}
        self._opening: dict[str, asyncio.Future] = {}
        self._lock = threading.Lock()

    async def get(self, model_id: str) -> Any:
        held = self._held.get(model_id)
        if held is not None:
            return held
        opening = self._opening.get(model_id)
        if opening is None:  # the first caller opens it; later ones wait on the same open
            opening = asyncio.ensure_future(asyncio.to_thread(self._open, model_id))
            self._opening[model_id] = opening
            opening.add_done_callback(lambda _: self._opening.pop(model_id, None))
        # shielded: a caller that leaves does not cancel the open the others wait for
        return await asyncio.shield(opening)

    async def checked(self, spec: ModelSpec) -> Any:
        """``spec``'s tokenizer, opened on first use (a 424 when it cannot be)."""
        try:
            return await self.get(spec.id)
        except LoadProblem as exc:
            raise ModelLoadFailed(f"model {spec.id!r}: its tokenizer could not be opened: "
                                  f"{exc}", param="model", model=spec.id) from exc

    def forget(self, model_id: str) -> None:
        """Open ``model_id``'s tokenizer again on its next use (its spec changed)."""
        with self._lock:
            self._held.pop(model_id, None)

    def _open(self, model_id: str) -> Any:
        with self._lock:
            if model_id not in self._held:
                self._held[model_id] = open_tokenizer(self._open_folder(model_id))
            return self._held[model_id]


def model_folder(spec: ModelSpec, cache_dir: str | None) -> Path:
    """Where ``spec``'s tokenizer is read from; a fake model has none (a 422: the request's
    to change, not a load failure)."""
    if spec.is_fake:
        raise InvalidValue(f"model {spec.id!r} is a test stand-in and has no tokenizer",
                           param="model")
    return resolve_source(spec, cache_dir)
