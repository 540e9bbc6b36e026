"""Encoders, one backend per module under one contract (``base``): what every bi-encoder
shares (``bi_encoder``), sentence-transformers on torch (``sentence_transformer``), ONNX on
onnxruntime alone (``onnx_native``) or in a sentence-transformers model's transformer
(``onnx_module``), cross-encoders and classifiers (``cross_encoder``), a
causal LM's yes/no logits as a reranker (``llm_reranker``), SPLADE (``sparse``), a
late-interaction model's multi-vectors (``colbert``) and a deterministic fake (``fake``); sentence-transformers models opened and wrapped
(``st_models``), text to token ids (``token_ids``), the output options every backend's
vectors may go through (``postprocess``: ``dimensions`` and ``dtype``) and the fixed texts
backends are checked with (``probes``).

Nothing here loads a registered model: ``blitz.loading`` turns a ``ModelSpec`` into an
encoder. This package module imports nothing, so any module here can be imported alone.
"""
