"""A transformer to an ONNX graph with torch's own exporter: what a build's
``onnx/model.onnx`` holds (``blitz.loading.onnx_export``).

The graph takes what the model's tokenizer gives (``input_ids``, ``attention_mask``, and
``token_type_ids`` where the tokenizer emits them) and, for a decoder, ``position_ids``;
it returns ``last_hidden_state`` (a bi-encoder's transformer) or ``logits`` (a
sequence-classification head), with batch and sequence dynamic. Both runners feed it
alike: ``blitz.encoders.onnx_native`` on its own, ``blitz.encoders.onnx_module`` in a
sentence-transformers model.

It is traced with eager attention: that pattern is the one onnxruntime's transformer
fusions recognise (``fuse_transformer_ops``), and an SDPA trace fuses no attention. The
exporter is TorchScript's (``dynamo=False``), as for a dual encoder's towers
(``blitz.images.onnx_dual``): it traces transformers' masks with dynamic shapes and needs
no other package.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

OPSET = 17
EXAMPLE_TEXTS = ["a photo of a cat", "two dogs running on a sunny beach at noon"]
TOKENIZER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_transformer(transformer: Any, tokenizer: Any, target: Path, *, output: str,
                       pairs: bool = False) -> tuple[str, ...]:
    """``transformer`` (a transformers model, torch, CPU) as an ONNX graph at ``target``
    returning ``output``; ``pairs`` when it reads (query, document) pairs. Returns the
    graph's input names. The model is left on eager attention."""
    import torch

    if hasattr(transformer, "set_attn_implementation"):
        transformer.set_attn_implementation("eager")
    queries = [EXAMPLE_TEXTS[0]] * len(EXAMPLE_TEXTS)  # (query, document) pairs when pairs
    example = tokenizer(*((queries, EXAMPLE_TEXTS) if pairs else (EXAMPLE_TEXTS,)),
                        padding=True, return_tensors="pt")
    inputs = {name: example[name] for name in TOKENIZER_INPUTS if name in example}
    if is_decoder(transformer.config):
        ids = inputs["input_ids"]
        inputs["position_ids"] = torch.arange(ids.shape[1]).expand(ids.shape)
    names = tuple(inputs)

    class Traced(torch.nn.Module):  # the model's forward on what the tracer passes
        def __init__(self) -> None:
            super().__init__()
            self.model = transformer

        def forward(self, *values: Any) -> Any:
            return self.model(**dict(zip(names, values, strict=True)), return_dict=True)[output]

    dynamic = {name: {0: "batch", 1: "sequence"} for name in names}
    target.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the tracer's constants, the exporter's deprecation
        torch.onnx.export(
            Traced().eval(), tuple(inputs.values()), str(target),
            input_names=list(names), output_names=[output], opset_version=OPSET,
            dynamo=False, dynamic_axes={**dynamic, output: {0: "batch"} if output == "logits"
                                        else {0: "batch", 1: "sequence"}})
    return names


def is_decoder(config: Any) -> bool:
    """Whether ``config``'s architecture is a decoder (Qwen3, Gemma3, Llama, Mistral): a
    causal language model and no masked one (BERT is both)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    return (kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)
