"""Vision-language models: a decoder that reads texts and images in one sequence
(Qwen2-VL, Qwen3-VL and the models built on them), as an embedder and as a reranker.

- ``visual``: an image's resize rule and visual tokens (``ImageShape``), read without
  transformers for the ingress's budget, and the model's image processor (``VisualProcessor``).
- ``sequence``: a prompt's pieces (template text, a caller's texts, images) as token ids,
  placeholders expanded, cut to the model's length (``SequenceBuilder``, ``chat_pieces``).
- ``decoder``: what both share: documents of parts to sequences, micro-batched under the
  token budget, and the last hidden states (``VlDecoder``).
- ``embedder``: ``VlEmbedder`` (kind vl-embedding: Qwen3-VL-Embedding, GME).
- ``reranker``: ``VlReranker`` (kind vl-reranker: Qwen3-VL-Reranker, jina-reranker-m0).
- ``retriever``: ``ColVisionEncoder`` (kind vl-multi-vector: ColPali, ColQwen2): pages and
  queries to multi-vectors, scored by MaxSim.
"""
