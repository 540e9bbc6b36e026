"""What crosses a hop, defined once: the jobs an ingress sends a pool replica, and the
results the ingress answers with.

- Jobs (``EmbedJob``, ``ImageEmbedJob``, ``RerankJob``, ``TokenEmbedJob``,
  ``SparseEmbedJob``, ``HybridEmbedJob``, ``ClassifyJob``, ``PartsJob``,
  ``MultiVectorJob``, ``LateChunkJob``): ingress -> pool, over Serve's
  handle or the local hop, pickled either way; never larger than the pool's batch limit.
  Each carries its request's ``priority`` (``PRIORITIES``) and ``trace`` (its request's
  span context while tracing is on: ``blitz.runtime.tracing``), and runs itself on its
  model's encoder (``run``; text jobs share one call: ``text_job``, ``blitz.pool.mixed_batch``).
- Results (``EmbedResult``, ``RerankResult``, ``TokenEmbeddingsResult``, ``SparseResult``,
  ``HybridResult``, ``MultiVectorResult``, ``ChunkedEmbedResult``, ``SimilarityResult``, ``ClassifyResult``, ``TokenizeResult``,
  ``DecodeResult``): what the handle methods return, and what the HTTP routes write on
  the wire (``blitz.http.reply_bodies``).

Plain dataclasses, pickled by reference to this module: a rolling redeploy runs two
versions side by side, so the module keeps its name. The HTTP request bodies are
``blitz.http.bodies``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from blitz.encoders.base import Encoded, Encoder, MultiVectorReduce, TextJob
from blitz.errors import InvalidValue, echo

if TYPE_CHECKING:
    from blitz.encoders.postprocess import OutputDtype

# ---- priority (docs/operations.md, "Priorities: interactive ahead of bulk") ---------------

PRIORITIES = ("high", "normal", "low")
"""A request's priority by name; its level is its index here: level 0 is served first.
A waiting job moves up one level every ``priority_aging_s`` it waits (PoolSettings)."""
HIGH, NORMAL, LOW = range(len(PRIORITIES))
PriorityName = Literal["high", "normal", "low"]
PRIORITY_HELP = ("high | normal | low: the queues serve higher first, and a request "
                 "waiting priority_aging_s moves up one, so low is never starved; default "
                 "normal (header x-blitz-priority wins over the body). Held to the API "
                 "key's ceiling (auth.max_priority, normal unless auth.priority_grants "
                 "grants more): the reply's x-blitz-priority names the level it ran at")


def priority_level(value: object, param: str = "priority") -> int:
    """The level of a priority as sent (a name of ``PRIORITIES``, or None: normal); a 422
    naming ``param`` otherwise. Headers and metadata are lowercased before."""
    if value is None:
        return NORMAL
    if isinstance(value, str) and value in PRIORITIES:
        return PRIORITIES.index(value)
    raise InvalidValue(f"{param} must be one of {', '.join(PRIORITIES)}, not "
                       f"{echo(repr(value))}", param=param)


# ---- pool jobs (ingress -> pool) ---------------------------------------------------------

@dataclass(frozen=True)
class _Job:
    """What every job carries besides its inputs: its request's priority level, and its
    cost in queue units where that is not its length (a chunked job's windows, counted on
    the ingress: ``blitz.ingress.limits``). A job pickled by a version without them reads
    the class's defaults: normal, its length."""

    priority: int = dataclasses.field(default=NORMAL, kw_only=True)
    units: int = dataclasses.field(default=0, kw_only=True)  # 0: len(job)

    def text_job(self) -> TextJob | None:
        """Its texts, when it runs them with the batch's other texts in one padded call
        (``Encoder.embed_many_sided``: one vector per text whatever the batch); else None."""
        return None

    def run(self, encoder: Encoder) -> Encoded:
        """The job, run on its model's ``encoder`` (a worker thread's turn)."""
        raise NotImplementedError(type(self).__name__)


def _long(encoder: Encoder, long_inputs: str | None) -> dict[str, str]:
    """A request's ``long_inputs`` for an encoder that takes it (``long_inputs``)."""
    return {"long_inputs": long_inputs} if long_inputs and (
        "long_inputs" in encoder.capabilities) else {}


J = TypeVar("J", bound=_Job)


def with_priority(job: J, level: int) -> J:
    """``job`` at priority ``level`` (the ingress's queue hands the pool a job it aged)."""
    return job if job.priority == level else dataclasses.replace(job, priority=level)


PIXELS_PER_UNIT = 1_000_000  # an image job's declared pixels per queue unit (a photo's)


def image_units(images: int, pixels: int) -> int:
    """An image job's cost in queue units: one an image, or one a ``PIXELS_PER_UNIT`` of
    its declared pixels where that is more (decoding, not the model, is what grows)."""
    return max(images, -(-pixels // PIXELS_PER_UNIT))


def units_of(job: Any) -> int:
    """A job's cost in queue and batch units (``Batcher``'s ``size``): a chunked job's
    windows, an image job's images or megapixels (``image_units``), else
    its texts (documents, inputs)."""
    return getattr(job, "units", 0) or len(job)


def priority_of(job: object) -> int:
    """A job's priority level (``Batcher``'s ``priority``); normal for anything else."""
    level = getattr(job, "priority", NORMAL)
    return level if isinstance(level, int) and HIGH <= level <= LOW else NORMAL


@dataclass(frozen=True)
class EmbedOptions:
    """An embedding request's options, one value from the body (HTTP's, gRPC's, a handle
    call's) through the service and the vector cache's key to the job. None: the model's."""

    normalize: bool | None = None  # unit-length rows
    truncate: bool = True  # cut an over-long input (False: refuse it)
    truncation_side: str | None = None  # left | right
    long_inputs: str | None = None  # truncate | error | chunk
    return_chunks: bool = False  # chunked, with each window's vector and offsets too
    dimensions: int | None = None  # Matryoshka: keep the first N
    dtype: OutputDtype = "float32"
    prompt_name: str | None = None  # a prompt of the model's spec
    instruction: str | None = None  # a free-form task in the model's instruction_template

    def normalized(self, default: bool) -> bool:
        """Whether to normalize: as asked, or the model's ``default``."""
        return default if self.normalize is None else self.normalize

    def keywords(self) -> dict[str, Any]:
        """As ``EmbeddingService.embed``'s keywords (its handle face)."""
        return dataclasses.asdict(self)

    def job(self, texts: list[str], default_normalize: bool) -> EmbedJob:
        """The pool call of ``texts`` (one chunk of the request's) with these options."""
        return EmbedJob(texts=texts, normalize=self.normalized(default_normalize),
                        truncate=self.truncate, truncation_side=self.truncation_side,
                        long_inputs=self.long_inputs, return_chunks=self.return_chunks)


@dataclass(frozen=True)
class EmbedJob(_Job):
    """Texts (or token ids) for one pool call; never larger than the pool's batch limit."""

    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    normalize: bool = True
    truncate: bool = True
    truncation_side: str | None = None  # left | right; None: the model's
    long_inputs: str | None = None  # truncate | error | chunk; None: the model's
    return_chunks: bool = False  # chunked, with each window's vector and offsets too
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or ())

    def text_job(self) -> TextJob | None:
        return None if self.texts is None else TextJob(
            self.texts, self.normalize, self.truncate, self.truncation_side, self.long_inputs,
            self.return_chunks)

    def run(self, encoder: Encoder) -> Encoded:
        """Its token ids' vectors (its texts run with the batch's: ``text_job``)."""
        assert self.token_ids is not None
        return encoder.embed_tokens(self.token_ids, normalize=self.normalize,
                                    truncate=self.truncate)


@dataclass(frozen=True)
class ImageEmbedJob(_Job):
    """Encoded images (their bytes, as a client sent them; the ingress checked their
    headers against the image limits) for one pool call of a dual encoder. ``pixels``:
    the width x height their headers declare, summed (the job's decoding cost; 0 when
    not counted); ``first``: the request's index of the first image (errors name
    ``images[first + i]``)."""

    images: list[bytes]
    normalize: bool = True
    trace: str | None = None
    pixels: int = 0
    first: int = 0

    def __len__(self) -> int:
        return len(self.images)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_image_bytes(self.images, normalize=self.normalize)


@dataclass(frozen=True)
class PartsJob(_Job):
    """Documents of a vision-language model for one pool call, each a tuple of parts in
    order: texts (``str``) and encoded images (``bytes``, their headers checked at the
    ingress; a pool processes them before the queue, ``blitz.pool.image_prep``). With a
    ``query`` (a tuple of parts too) each document is scored against it (a vl-reranker),
    else embedded. ``pixels``: its images' declared width x height, summed; ``first``: the
    request's index of its first document."""

    documents: list[tuple]
    query: tuple | None = None
    normalize: bool = True
    instruction: str | None = None
    truncate: bool = True
    trace: str | None = None
    pixels: int = 0
    first: int = 0

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def encoded_images(self) -> int:
        """Its images still encoded (bytes): what a pool decodes before the queue."""
        return sum(isinstance(part, bytes) for doc in (*self.documents, self.query or ())
                   for part in doc)

    def run(self, encoder: Encoder) -> Encoded:
        if self.query is not None:
            return encoder.score_parts(self.query, self.documents,
                                       instruction=self.instruction, truncate=self.truncate)
        return encoder.embed_parts(self.documents, normalize=self.normalize,
                                   instruction=self.instruction, truncate=self.truncate)


@dataclass(frozen=True)
class RerankJob(_Job):
    query: str
    documents: list[str]
    truncate: bool = True
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.documents)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.score(self.query, self.documents, truncate=self.truncate)


@dataclass(frozen=True)
class TokenEmbedJob(_Job):
    """Texts whose per-token vectors are asked for (``/embed_all``); never larger than the
    pool's batch limit."""

    texts: list[str]
    truncate: bool = True
    long_inputs: str | None = None  # truncate | error; None: the model's (never chunked)
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.texts)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_all(self.texts, truncate=self.truncate,
                                 **_long(encoder, self.long_inputs))


@dataclass(frozen=True)
class SparseEmbedJob(_Job):
    """Texts for a sparse (SPLADE) model (``/embed_sparse``); at most the batch limit."""

    texts: list[str]
    truncate: bool = True
    long_inputs: str | None = None  # truncate | error | chunk; None: the model's
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.texts)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_sparse(self.texts, truncate=self.truncate,
                                    **_long(encoder, self.long_inputs))


@dataclass(frozen=True)
class HybridEmbedJob(_Job):
    """Texts for a hybrid (bge-m3) model (``/embed_hybrid``) and the outputs asked for
    (of "dense", "sparse", "colbert"); at most the batch limit."""

    texts: list[str]
    outputs: tuple[str, ...]
    truncate: bool = True
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.texts)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_hybrid(self.texts, self.outputs, truncate=self.truncate)


@dataclass(frozen=True)
class MultiVectorJob(_Job):
    """Texts for a late-interaction model (``/embed_multivector``), as queries or
    documents, or pages (``images``: encoded bytes, their headers checked at the ingress; a
    pool decodes and resizes them before the queue, ``blitz.pool.image_prep``), and how to
    shrink their vectors (``MultiVectorReduce``); at most the batch limit. ``pixels``: its
    images' declared pixels; ``first``: the request's index of its first image."""

    texts: list[str]
    query: bool = False
    truncate: bool = True
    reduce: MultiVectorReduce | None = None
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)
    images: list[Any] | None = None
    pixels: int = 0
    first: int = 0

    def __len__(self) -> int:
        return len(self.images) if self.images else len(self.texts)

    @property
    def encoded_images(self) -> int:
        """Its images still encoded (bytes): what a pool decodes before the queue."""
        return sum(isinstance(image, bytes) for image in self.images or ())

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_multi(self.texts, query=self.query, truncate=self.truncate,
                                   reduce=self.reduce, images=self.images)


@dataclass(frozen=True)
class LateChunkJob(_Job):
    """Documents, each its chunks in order, for late chunking (``late_chunking``,
    ``/v1/contextualizedembeddings``): one vector per chunk, each pooled from its own
    tokens of its document's one run. Its units are its documents' windows (counted on the
    ingress); never larger than the batch limit."""

    documents: list[list[str]]
    normalize: bool = True
    pooling: str | None = None  # mean | max | first | last; None: the model's
    truncate: bool = True
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.documents)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.embed_late_chunks(self.documents, normalize=self.normalize,
                                         pooling=self.pooling, truncate=self.truncate)


@dataclass(frozen=True)
class ClassifyJob(_Job):
    """Inputs for a classifier (``/predict``, ``/classify``): each one text or a text
    pair; never larger than the pool's batch limit."""

    inputs: list[list[str]]
    truncate: bool = True
    trace: str | None = None  # the hop's W3C trace context (blitz.runtime.tracing)

    def __len__(self) -> int:
        return len(self.inputs)

    def run(self, encoder: Encoder) -> Encoded:
        return encoder.classify(self.inputs, truncate=self.truncate)


# ---- results (handle API and HTTP replies) -----------------------------------------------

@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    total_tokens: int
    image_tokens: int = 0  # of them, a vision-language model's visual tokens
    image_pixels: int = 0  # its images' width x height as declared, summed

    @classmethod
    def of(cls, tokens: int) -> Usage:
        return cls(prompt_tokens=tokens, total_tokens=tokens)


@dataclass(frozen=True)
class TextChunks:
    """One text's windows (``return_chunks``): their vectors (windows, dimension), after
    the request's normalize, dimensions and dtype, and each window's [start, end)
    character offsets in the text as sent (windows, 2), int64."""

    embeddings: np.ndarray
    offsets: np.ndarray


@dataclass(frozen=True)
class EmbedResult:
    """What ``handle.embed.remote(...)`` returns: the array plus usage; with
    ``return_chunks``, each text's windows too."""

    embeddings: np.ndarray
    model: str
    usage: Usage
    pool: str = "cpu"
    chunks: list[TextChunks] | None = None


@dataclass(frozen=True)
class RerankHit:
    index: int
    relevance_score: float
    document: str | None = None


@dataclass(frozen=True)
class TokenEmbeddingsResult:
    """What ``handle.embed_all.remote(...)`` returns: per text, one float32 row per token
    (special tokens included, padding left out), shape (tokens, hidden)."""

    embeddings: list[np.ndarray]
    model: str
    usage: Usage
    pool: str = "cpu"


@dataclass(frozen=True)
class MultiVectorResult:
    """What ``handle.embed_multi.remote(...)`` returns: per text its vectors, shape
    (vectors, dimension) (a query's up to its expanded length, a document's tokens kept,
    fewer when pooled), or with MUVERA one row each (``muvera_dim`` wide); as ``dtype``
    asked (packed bits for binary ones)."""

    embeddings: list[np.ndarray]
    model: str
    usage: Usage
    dimension: int
    muvera: bool = False
    pool: str = "cpu"


@dataclass(frozen=True)
class ChunkedEmbedResult:
    """What ``handle.embed_late_chunks.remote(...)`` returns: per document, one row per
    chunk, shape (chunks, dimension), as ``dtype`` asked."""

    embeddings: list[np.ndarray]
    model: str
    usage: Usage
    pool: str = "cpu"


@dataclass(frozen=True)
class SparseVector:
    """One text's sparse embedding: vocabulary ids, ascending, and their weights."""

    indices: np.ndarray  # int32
    values: np.ndarray  # float32


@dataclass(frozen=True)
class SparseResult:
    """What ``handle.embed_sparse.remote(...)`` returns: one ``SparseVector`` per text, over a
    vocabulary of ``dimension`` ids."""

    embeddings: list[SparseVector]
    dimension: int | None  # None: a model whose files are not on the ingress's machine
    model: str
    usage: Usage
    pool: str = "cpu"


@dataclass(frozen=True)
class HybridResult:
    """What ``handle.embed_hybrid.remote(...)`` returns: per text the outputs asked for,
    None for the others: dense vectors (normalized), sparse (lexical) vectors and ColBERT
    token vectors (tokens, hidden), normalized."""

    dense: list[np.ndarray] | None
    sparse: list[SparseVector] | None
    colbert: list[np.ndarray] | None
    dimension: int | None  # the sparse vectors' vocabulary size when known
    model: str
    usage: Usage
    pool: str = "cpu"


@dataclass(frozen=True)
class SimilarityResult:
    """What ``handle.similarity.remote(...)`` returns: the cosine similarity of the source
    text to each sentence, in order."""

    scores: list[float]
    model: str
    usage: Usage
    pool: str = "cpu"


@dataclass(frozen=True)
class Prediction:
    score: float
    label: str


@dataclass(frozen=True)
class ClassifyResult:
    """What ``handle.classify.remote(...)`` returns: per input its labels' scores, best
    first (probabilities: softmax over the labels, or a sigmoid for a one-label model;
    the raw logits with ``raw_scores``)."""

    predictions: list[list[Prediction]]
    model: str
    usage: Usage
    pool: str = "cpu"


@dataclass(frozen=True)
class Token:
    """One token of ``/tokenize`` (Hugging Face TEI's ``SimpleToken``): ``text`` is the
    input's own characters (a special token's name), ``start``/``stop`` its offsets (None
    for a special token, or when offsets were not asked for)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


@dataclass(frozen=True)
class TokenizeResult:
    """What ``handle.tokenize.remote(...)`` returns: each text's tokens."""

    tokens: list[list[Token]]
    model: str


@dataclass(frozen=True)
class DecodeResult:
    """What ``handle.decode.remote(...)`` returns: one text per row of ids."""

    texts: list[str]
    model: str


@dataclass(frozen=True)
class RerankResult:
    """What ``handle.rerank.remote(...)`` returns: hits sorted by score, best first."""

    results: list[RerankHit]
    model: str
    usage: Usage
    pool: str = "cpu"
