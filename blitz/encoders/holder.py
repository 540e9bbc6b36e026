"""The object a pool's multiplexed loader returns: it owns one encoder and frees it on eviction.

Ray calls ``__del__`` when the model is evicted and Python calls it again when the
object is collected, so it is idempotent.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from blitz.encoders.base import Encoder


class ModelHolder:
    def __init__(self, encoder: Encoder, on_release: Callable[[str], None] | None = None):
        self.model_id = encoder.model_id
        self.encoder: Encoder | None = encoder
        self._on_release = on_release

    def get(self) -> Encoder:
        if self.encoder is None:
            raise RuntimeError(f"model {self.model_id!r} was evicted")
        return self.encoder

    def __del__(self) -> None:
        encoder, self.encoder = self.encoder, None
        if encoder is None:
            return
        on_cuda = encoder.device.startswith("cuda")
        encoder.close()
        del encoder
        gc.collect()
        if on_cuda:
            import torch

            torch.cuda.empty_cache()
        if self._on_release is not None:
            self._on_release(self.model_id)
