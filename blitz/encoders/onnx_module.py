"""An ONNX graph in the place of a sentence-transformers model's transformer.

The ONNX builds that ``blitz.encoders.onnx_native`` cannot run on onnxruntime alone (a
cross-encoder, a classifier, a bi-encoder with a Dense layer or a tokenizer the
``tokenizers`` library cannot run alone) run through sentence-transformers: the model is
opened from its folder as for torch, and its ``Transformer`` module's model is replaced by
an ``OnnxTransformer``, which runs the build's graph (``blitz.loading.graph_export``) on
onnxruntime. Tokenization, pooling, heads and activations stay sentence-transformers' own,
so the build differs from the torch model only in the transformer.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from blitz.runtime import model_threads


def replace_transformer(model: Any, graph: Path) -> Any:
    """``model`` (a ``SentenceTransformer`` or ``CrossEncoder``, torch) with its first
    module's transformer replaced by the ONNX graph at ``graph``; the torch weights are
    released. Returns ``model``."""
    first = model[0]
    first.model = _transformer_class()(model_threads.onnx_session(graph),
                                               first.model.config)
    return model


@functools.cache
def _transformer_class() -> type:
    """``OnnxTransformer``, a torch module: defined when first needed, as torch is imported
    only where a model runs through sentence-transformers."""
    torch = model_threads.torch_module()

    class OnnxTransformer(torch.nn.Module):  # type: ignore[name-defined]
        """A transformers model's forward on onnxruntime: the graph's inputs from the
        keyword arguments (``position_ids`` 0..width-1 when not given, as transformers
        computes them for a decoder; ``token_type_ids`` zeros), its one output returned
        under its name (``last_hidden_state`` or ``logits``)."""

        def __init__(self, session: Any, config: Any):
            super().__init__()
            self.session, self.config = session, config
            self.input_names = [i.name for i in session.get_inputs()]
            self.output = session.get_outputs()[0].name
            # sentence-transformers reads a module's device and dtype from its tensors
            self.register_buffer("_anchor", torch.zeros(0), persistent=False)

        @property
        def dtype(self) -> Any:
            return torch.float32

        def forward(self, input_ids: Any, attention_mask: Any = None, **features: Any
                    ) -> dict[str, Any]:
            ids = np.ascontiguousarray(input_ids.cpu().numpy(), dtype=np.int64)
            given = {"input_ids": ids,
                     "attention_mask": np.ones_like(ids) if attention_mask is None
                     else attention_mask.cpu().numpy().astype(np.int64, copy=False)}
            for name in self.input_names:
                value = features.get(name)
                if name in given:
                    continue
                if value is not None:
                    given[name] = value.cpu().numpy().astype(np.int64, copy=False)
                elif name == "position_ids":
                    given[name] = np.ascontiguousarray(np.broadcast_to(
                        np.arange(ids.shape[1], dtype=np.int64), ids.shape))
                else:  # token_type_ids: one segment
                    given[name] = np.zeros_like(ids)
            out = self.session.run([self.output], {n: given[n] for n in self.input_names})[0]
            return {self.output: torch.from_numpy(np.asarray(out, dtype=np.float32))}

    return OnnxTransformer
