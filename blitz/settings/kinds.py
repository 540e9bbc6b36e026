"""Every model kind, declared once: ``KINDS``, one ``ModelKind`` row a kind.

A row says what a kind's models take and produce, the services (routes) the ingress lets
them answer (``SERVICES``), the calls their encoder answers (``CAPABILITIES``: an
encoder declares them, ``blitz.encoders.base.Encoder.capabilities``, and refuses the
others alike), the backends they run on, how they are opened and how their facts are
read, what a request to them costs (the budget's units: ``KindCost``,
``blitz.ingress.limits``) and how their jobs batch. Everything that differs by kind reads
a column here; nothing else names a kind. Data only: no model code is imported.

A new kind is a row here, an encoder that declares its capabilities, a job and its input
decoder, and a route (docs/architecture.md, "Where to add a model kind").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

Kind = Literal["embedding", "cross-encoder", "classifier", "sparse", "llm-reranker", "hybrid",
               "dual-encoder", "vl-embedding", "vl-reranker", "multi-vector",
               "vl-multi-vector"]
"""The kinds by name, in the order of ``KINDS`` (a spec's ``kind``; checked against it)."""

Capability = Literal["embed", "embed_tokens", "embed_all", "embed_sparse", "embed_hybrid",
                     "classify", "score", "embed_images", "long_inputs", "embed_parts",
                     "score_parts", "embed_multi", "late_chunks"]
"""An encoder's calls: ``Encoder.embed``, ``embed_tokens``, ``embed_all``,
``embed_sparse``, ``embed_hybrid``, ``classify``, ``score``, the image calls
(``embed_images``: ``prepare_images``, ``embed_prepared``, ``embed_image_bytes``),
``long_inputs``: a request's truncation side and chunk windows (``embed_many_sided``),
and a vision-language model's documents of text and image parts: ``embed_parts`` (one
vector each) and ``score_parts`` (each scored against a query of parts),
``embed_multi``: a late-interaction model's vectors per input (a query's or a
document's; pooled, or as one MUVERA vector), and ``late_chunks``: each chunk of a
document pooled from the document's one run (late chunking)."""
CAPABILITIES: tuple[Capability, ...] = get_args(Capability)

Service = Literal["embed", "embed_all", "embed_sparse", "embed_hybrid", "classify",
                  "embed_images", "bulk", "embed_parts", "rerank_parts", "embed_multi",
                  "late_chunks"]
"""What the ingress refuses a model whose kind does not serve it: ``/embed`` (and every
route over dense vectors: OpenAI's, Cohere's, ``/similarity``), ``/embed_all``,
``/embed_sparse``, ``/embed_hybrid``, ``/predict`` and ``/classify``, images, a bulk
job, documents of text and image parts to embed (vLLM's ``messages``, Cohere's
``inputs``, Jina's, Voyage's, Blitz's ``parts``) and to rerank by the model (a
vision-language reranker; a dual encoder or vision-language embedder reranks images by
cosine), a late-interaction model's multi-vectors (``/embed_multivector``) and a
document's chunks embedded in its context (``late_chunking``,
``/v1/contextualizedembeddings``). ``/rerank`` serves every kind (an embedding model by cosine), ``/tokenize`` too."""
SERVICES: tuple[Service, ...] = get_args(Service)

CPU_BACKENDS = ("torch", "torch-bf16", "onnx", "onnx-int8")
"""Every named CPU backend (``auto`` chooses among them; ``fake`` plays any kind)."""


class KindCost(NamedTuple):
    """What a request to a model of one kind costs, beyond its texts: whether its texts may
    be cut into windows (counted: ``count_windows``), whether it answers one vector per
    token (counted: ``max_token_vectors_per_request``), whether it takes images (their
    declared pixels: ``images.*``), and what its output holds."""

    inputs: str
    windows: bool = False
    token_vectors: bool = False
    pixels: bool = False
    output: str = ""
    visual_tokens: bool = False  # images in its sequences (``max_visual_tokens_per_request``)


@dataclass(frozen=True)
class ModelKind:
    """One model kind. ``cost.inputs`` is what it takes, ``cost.output`` what it produces."""

    name: Kind
    about: str  # what its models are, and the routes they answer (the spec's kind doc)
    cost: KindCost  # what it takes and produces, and the budget's units (limits.KIND_COSTS)
    serves: frozenset[Service]  # the ingress services it answers (besides /rerank)
    capabilities: frozenset[Capability]  # what its (torch) encoder answers
    encoder: str  # its torch encoder class, dotted (a fake encoder plays any kind)
    opens: Literal["sentence-transformers", "sequence-classification", "masked-lm",
                   "bge-m3", "causal-lm", "two-towers", "vision-language",
                   "multi-vector", "retrieval"]  # what loads
    # and exports it
    backends: tuple[str, ...]  # the cpu_backends it runs on (auto: chosen at load)
    backend_refusal: str | None  # the refusal of another backend ({id} {kind} {backend});
    # None: every backend but auto, refused as auto is
    answers: Literal["vectors", "scores", "labels"]  # what the accuracy guard probes
    dimension: Literal["modules", "vocabulary", "projection", "decoder",
                       "embedding_dim"] | None  # read_dimension's source: sentence-transformers'
    # modules, the vocabulary, the towers' projection, the decoder's hidden size, the
    # config's embedding_dim (a retriever's); None: none
    pooling: str | None  # what /info reports as its pooling (None: the model files')
    model_type: Literal["embedding", "reranker", "classifier"]  # TEI's /info model_type
    tei_root: Literal["embed", "rerank", "predict", "embed_sparse"]  # TEI's POST / for it
    infinity: tuple[str, ...]  # Infinity's capability names (GET /models)
    raw_scores: bool  # whether /rerank may answer raw scores (cosine, not an activation)
    own_fields: tuple[str, ...]  # spec fields for this kind alone
    batching: str  # how its jobs share a model call

    @property
    def reranks_only(self) -> bool:
        """A model that only reranks: routed to the reranker pool whatever the size."""
        return self.model_type == "reranker"


_TORCH_ONLY = "{id!r}: {kind} models run on torch; set cpu_backend to torch"
_TEXTS_SHARE = "text jobs share one padded, length-sorted call; others one call each"
_ONE_CALL = "one call a job, several jobs in one worker turn"
RERANKER_FIELDS = ("reranker_style", "rerank_instruction", "yes_token", "no_token")
IMAGE_TOKEN_FIELDS = ("image_max_tokens", "image_min_tokens")
_VL_BATCHING = ("one call a job; its documents in micro-batches of max_batch_tokens padded "
                "tokens, visual tokens included; images decoded and processed before the queue")
_VL_TORCH = "{id!r}: {kind} models run on torch (fp32 on a CPU, gpu_dtype on a GPU)"

KINDS: dict[str, ModelKind] = {row.name: row for row in (
    ModelKind(
        "embedding", "a bi-encoder: /embed, /v1/embeddings, /embed_all",
        KindCost("texts", windows=True, token_vectors=True,
                 output="texts x dimension (+ windows x dimension with return_chunks)"),
        frozenset({"embed", "embed_all", "bulk", "late_chunks"}),
        frozenset({"embed", "embed_tokens", "embed_all", "score", "long_inputs",
                   "late_chunks"}),
        "blitz.encoders.bi_encoder.BiEncoder", "sentence-transformers",
        (*CPU_BACKENDS, "auto"), None, "vectors", "modules", None, "embedding", "embed",
        ("embed",), True, (), _TEXTS_SHARE),
    ModelKind(
        "cross-encoder", "/rerank",
        KindCost("documents (one query-document pair each)", output="scores"),
        frozenset(), frozenset({"score"}),
        "blitz.encoders.cross_encoder.CrossEncoderEncoder", "sequence-classification",
        CPU_BACKENDS, None, "scores", None, None, "reranker", "rerank", ("rerank",), False,
        (), _ONE_CALL),
    ModelKind(
        "classifier", "a sequence classifier: /predict, /classify",
        KindCost("inputs (a text or a pair each)", output="labels x inputs"),
        frozenset({"classify"}), frozenset({"score", "classify"}),
        "blitz.encoders.cross_encoder.ClassifierEncoder", "sequence-classification",
        CPU_BACKENDS, None, "labels", None, None, "classifier", "predict", ("classify",),
        False, (), _ONE_CALL),
    ModelKind(
        "sparse", "a SPLADE masked-language model: /embed_sparse; torch",
        KindCost("texts", windows=True, output="non-zero weights, at most the tokens"),
        frozenset({"embed_sparse"}),
        frozenset({"embed_tokens", "embed_sparse", "long_inputs"}),
        "blitz.encoders.sparse.SparseEncoder", "masked-lm", ("torch",), _TORCH_ONLY,
        "vectors", "vocabulary", "splade", "embedding", "embed_sparse", ("embed",), False,
        (), _ONE_CALL),
    ModelKind(
        "llm-reranker", "a causal LM scored by its yes/no logits: /rerank; torch or "
        "torch-bf16", KindCost("documents (one prompt each)", output="scores"),
        frozenset(), frozenset({"score"}),
        "blitz.encoders.llm_reranker.LlmRerankerEncoder", "causal-lm",
        ("torch", "torch-bf16"),
        "{id!r}: an llm-reranker runs on torch or torch-bf16; cpu_backend {backend} (no ONNX "
        "build of a causal LM's yes/no scoring is made or checked) is not served",
        "scores", None, None, "reranker", "rerank", ("rerank",), False, RERANKER_FIELDS,
        _ONE_CALL),
    ModelKind(
        "hybrid", "bge-m3: dense, sparse and ColBERT vectors from one forward pass; torch",
        KindCost("texts", windows=True, token_vectors=True,
                 output="dense and sparse per text, ColBERT one vector per token"),
        frozenset({"embed", "embed_all", "embed_sparse", "embed_hybrid"}),
        frozenset({"embed", "embed_tokens", "embed_all", "embed_sparse", "embed_hybrid",
                   "score", "long_inputs"}),
        "blitz.encoders.sparse.HybridEncoder", "bge-m3", ("torch",), _TORCH_ONLY, "vectors",
        None, "cls", "embedding", "embed", (), False, (), _ONE_CALL),
    ModelKind(
        "dual-encoder", "CLIP, SigLIP: texts and images into one space; torch, onnx or "
        "onnx-int8", KindCost("texts or images", pixels=True, output="inputs x dimension"),
        frozenset({"embed", "embed_images", "bulk"}),
        frozenset({"embed", "score", "embed_images"}),
        "blitz.images.dual_encoder.DualEncoder", "two-towers", ("torch", "onnx", "onnx-int8"),
        "{id!r}: dual-encoder models run on torch, onnx or onnx-int8 (no {backend} yet); set "
        "cpu_backend to one of them", "vectors", "projection", "projection", "embedding",
        "embed", (), False, (), "text jobs share one call; images are decoded before the "
        "queue, one call a job"),
    ModelKind(
        "vl-embedding", "a vision-language decoder (Qwen3-VL-Embedding, GME): texts, images "
        "and documents mixing both into one space; torch",
        KindCost("texts, images or documents of parts", pixels=True, visual_tokens=True,
                 output="inputs x dimension"),
        frozenset({"embed", "embed_images", "embed_parts"}),
        frozenset({"embed", "score", "embed_images", "embed_parts"}),
        "blitz.vision_language.embedder.VlEmbedder", "vision-language", ("torch",), _VL_TORCH,
        "vectors", "decoder", "lasttoken", "embedding", "embed", ("embed", "image_embed"),
        False, ("vl_instruction", *IMAGE_TOKEN_FIELDS), _VL_BATCHING),
    ModelKind(
        "vl-reranker", "a vision-language reranker (Qwen3-VL-Reranker, jina-reranker-m0): a "
        "query against documents of texts, images or both: /rerank; torch",
        KindCost("documents (one prompt each, its images' tokens included)", pixels=True,
                 visual_tokens=True, output="scores"),
        frozenset({"rerank_parts"}), frozenset({"score", "score_parts"}),
        "blitz.vision_language.reranker.VlReranker", "vision-language", ("torch",), _VL_TORCH,
        "scores", None, None, "reranker", "rerank", ("rerank",), False,
        ("reranker_style", "rerank_instruction", *IMAGE_TOKEN_FIELDS), _VL_BATCHING),
    ModelKind(
        "multi-vector", "a late-interaction (ColBERT) model, sentence-transformers' "
        "MultiVectorEncoder or PyLate folders: /embed_multivector, /rerank by MaxSim; torch",
        KindCost("texts (queries or documents)", token_vectors=True,
                 output="one vector per token kept, or one MUVERA vector per text"),
        frozenset({"embed_multi"}), frozenset({"embed_multi", "score"}),
        "blitz.encoders.colbert.ColbertEncoder", "multi-vector", ("torch",), _TORCH_ONLY,
        "vectors", "modules", None, "embedding", "embed", ("embed",), False, (),
        "one call a job: its texts length-sorted in batches of the pool's batch size"),
    ModelKind(
        "vl-multi-vector", "a visual document retriever (ColPali, ColQwen2: transformers' "
        "*ForRetrieval): page images and text queries to multi-vectors: /embed_multivector, "
        "/rerank by MaxSim; torch",
        KindCost("page images or texts (queries)", token_vectors=True, pixels=True,
                 output="one vector per token (a page's image tokens and prompt), or one "
                 "MUVERA vector per input"),
        frozenset({"embed_multi"}), frozenset({"embed_multi", "score"}),
        "blitz.vision_language.retriever.ColVisionEncoder", "retrieval", ("torch",),
        _VL_TORCH, "vectors", "embedding_dim", None, "embedding", "embed", ("embed",), False,
        (), "one call a job: its pages in batches of max_batch_tokens tokens; pages decoded "
        "and resized before the queue"),
)}
"""Every model kind by name; the one place a kind is declared."""

assert tuple(KINDS) == get_args(Kind), "Kind names the rows of KINDS, in order"

_ABOUT = [f"{row.name} ({row.about})" for row in KINDS.values()]
KINDS_DOC = ", ".join(_ABOUT[:-1]) + " or " + _ABOUT[-1]
"""Every kind and what it is, as a spec's ``kind`` documents them."""


def kind_of(name: str) -> ModelKind:
    """The row of kind ``name`` (a spec's ``kind``, validated against ``Kind``)."""
    return KINDS[name]


def serving(service: Service) -> tuple[str, ...]:
    """The kinds that serve ``service``, in table order."""
    return tuple(name for name, row in KINDS.items() if service in row.serves)
