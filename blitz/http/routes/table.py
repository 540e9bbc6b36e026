"""Every route of the HTTP API, declared once (``ROUTES``): its method and path, the
function that answers it, its request body's model, the service calls it makes, its reply's
formats and the words that document it. The router (``blitz.http.api``), the OpenAPI
document (``blitz.http.openapi``), the handle methods (``deployments/handle_methods.py``,
``handle_calls``) and the client's check read this table; a route added here is routed,
documented and, when it calls a new service method, offered on the handle.

Order is the router's: the hot routes first. ``tei`` routes (Hugging Face TEI's own paths)
answer errors in TEI's shape unless the reply is msgpack (Blitz's own). A route's
``variants`` take the bodies that ask for other inputs (``Variant.asks``: images, documents
of text and image parts), the first that asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pydantic import BaseModel

from blitz import codecs
from blitz.batches.service import BatchService
from blitz.http import bodies
from blitz.http.routes import (
    batches,
    blitz_api,
    cohere,
    images,
    infinity,
    late_interaction,
    openai,
    parts,
    tei,
)
from blitz.ingress import status
from blitz.ingress.images import ImageService
from blitz.ingress.late_interaction import LateInteractionService
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.parts import PartsService
from blitz.ingress.service import EmbeddingService
from blitz.ingress.tokenizing import TokenService

JSON, MSGPACK, RAW = "application/json", "application/msgpack", codecs.RAW_TYPE
ANY = (JSON, MSGPACK)

# A service call: the service the ingress holds (service, outputs, tokens or images) and the
# function called (its method, or blitz.ingress.status.info, a function of the service).
Call = tuple[str, Callable[..., Any]]


class Variant(NamedTuple):
    """A route's variant for other inputs: the body asks for them (``asks``), ``run``
    answers it (its body's model: ``body``)."""

    asks: Callable[[Any], bool]
    run: Callable[..., Any]
    body: type[BaseModel]
    calls: tuple[Call, ...]


class RouteSpec(NamedTuple):
    method: str
    path: str
    run: Callable[..., Any]  # route(kit, request, payload); a GET route: route(kit, request)
    summary: str
    body: type[BaseModel] | None  # the request body's model; None: no body
    reply: str  # what a 200 answers
    formats: tuple[str, ...] = (JSON,)  # the reply's media types (Accept picks)
    calls: tuple[Call, ...] = ()  # the service calls it makes (what a handle offers)
    tei: bool = False  # errors in TEI's shape
    variants: tuple[Variant, ...] = ()  # other inputs' bodies, the first that asks
    public: bool = False  # answered without an API key
    aside: bool = False  # a probe's alias or the description: not among HttpApi.routes,
    # and counted as "other" in the metrics
    batch: bool = False  # a batch's lines may call it (POST /v1/batches' `endpoint`)
    upload: bool = False  # its body is a multipart/form-data upload: `file` and `purpose`


EMBED = ("service", EmbeddingService.embed)
RERANK = ("service", EmbeddingService.rerank)
CLASSIFY = ("outputs", OutputService.classify)
EMBED_IMAGES = Variant(bodies.has_images, images.embed, images.EmbedImagesRequest,
                      (("images", ImageService.embed_images),))
OPENAI_IMAGES = Variant(bodies.image_modality, images.openai_embeddings,
                       images.OpenAIImagesRequest, (("images", ImageService.embed_images),))

EMBED_PARTS = ("parts", PartsService.embed_parts)
RERANK_PARTS = ("parts", PartsService.rerank_parts)
OPENAI_PARTS = Variant(parts.asks_chat_or_objects, parts.openai_embeddings,
                       parts.ChatEmbeddingRequest, (EMBED_PARTS,))


LATE_CHUNKS = ("late", LateInteractionService.embed_late_chunks)
OPENAI_LATE = Variant(late_interaction.asks_late_chunking, late_interaction.openai_late_chunks,
                      late_interaction.LateChunkingRequest, (LATE_CHUNKS,))


def _mixed_rerank(run: Callable[..., Any]) -> Variant:
    return Variant(parts.asks_mixed_rerank, run, parts.RerankPartsRequest, (RERANK_PARTS,))


_ROOT = ("The route of the default model's kind, as Hugging Face TEI serves it: an embedding "
         "model embeds (TEI's [[float]]) or, for {inputs: {source_sentence, sentences}}, "
         "scores similarity; a cross-encoder or LLM reranker reranks, a classifier predicts, a "
         "sparse model answers /embed_sparse's reply.")
_ROOT_CALLS = (EMBED, RERANK, CLASSIFY, ("outputs", OutputService.embed_sparse),
               ("outputs", OutputService.similarity))
_HEALTH = "{status: \"ok\", unix: seconds since the epoch}."
_FILE = ("OpenAI's file object: {id, object: \"file\", bytes, created_at, filename, purpose, "
         "status, expires_at}.")
_BATCH = ("OpenAI's batch object: {id, object: \"batch\", endpoint, input_file_id, status, "
          "output_file_id, error_file_id, errors, request_counts: {total, completed, failed}, "
          "created_at, ..._at, metadata}.")
_LIST = "OpenAI's list: {object: \"list\", data, first_id, last_id, has_more}."

ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec(
        "POST", "/embed", blitz_api.embed,
        "Embed texts or token ids (Blitz's texts, or Hugging Face TEI's inputs); images "
        "(`images`, a dual encoder's: blitz.http.routes.images.EmbedImagesRequest); "
        "documents of text and image parts (`parts`, a vision-language embedder's: "
        "blitz.http.routes.parts.EmbedPartsRequest); `late_chunking: true`: the texts are "
        "one document's chunks, each embedded in its context",
        bodies.EmbedRequest, "texts: {model, embeddings, shape, dtype, usage} (msgpack: the "
        "array in the numpy or portable layout; application/octet-stream: the little-endian "
        "array, its shape and dtype in x-blitz-shape and x-blitz-dtype). TEI's inputs on "
        "JSON: a bare [[float]].", (JSON, MSGPACK, RAW), (EMBED,),
        variants=(EMBED_IMAGES, Variant(parts.asks_parts, parts.embed, parts.EmbedPartsRequest,
                                        (EMBED_PARTS,)),
                  Variant(late_interaction.asks_late_chunking,
                          late_interaction.embed_late_chunks,
                          late_interaction.LateChunkingRequest, (LATE_CHUNKS,))), batch=True),
    RouteSpec(
        "POST", "/v1/embeddings", openai.openai_embeddings,
        "Embed texts (OpenAI's embeddings API), images with modality image (Infinity's), "
        "chat messages with images (vLLM's `messages`) or Jina's input objects "
        "({text} | {image}); Jina's `late_chunking: true` (the input is one document's "
        "chunks)", bodies.OpenAIEmbeddingRequest,
        "OpenAI's {object: \"list\", data: [{object: \"embedding\", index, embedding}], "
        "model, usage}; embedding is floats, or base64 of little-endian float32.",
        calls=(EMBED,), variants=(OPENAI_IMAGES, OPENAI_PARTS, OPENAI_LATE), batch=True),
    RouteSpec(
        "POST", "/rerank", infinity.rerank,
        "Rerank documents against a query (Infinity's documents, or TEI's texts; `images` "
        "in their place: a dual encoder's images scored against the query; documents of "
        "images or parts: a vision-language model's)",
        bodies.RerankRequest, "TEI's texts: [{index, text?, score}] best first. Infinity's "
        "documents: {object: \"rerank\", results: [{relevance_score, index, document?}], "
        "model, usage, id, created}. msgpack: Cohere's v1 shape.", ANY, (RERANK,),
        variants=(Variant(bodies.has_images, images.rerank, images.RerankImagesRequest,
                          (("images", ImageService.rerank_images),
                           ("late", LateInteractionService.rerank_pages))),
                  _mixed_rerank(parts.rerank)), batch=True),
    RouteSpec(
        "POST", "/v1/rerank", cohere.cohere_v1_rerank,
        "Rerank documents against a query (Cohere's v1 and Jina's; Jina's image and text "
        "objects: a vision-language model's)", bodies.RerankRequest,
        "{model, results: [{index, relevance_score, document?}], usage, id, meta}.", ANY,
        (RERANK,), variants=(_mixed_rerank(parts.rerank_v1),), batch=True),
    RouteSpec("POST", "/", tei.tei_root, "Hugging Face TEI's model-kind route",
              bodies.EmbedRequest, _ROOT, ANY, _ROOT_CALLS),
    RouteSpec(
        "POST", "/embeddings", openai.openai_embeddings,
        "Embed texts (Infinity's and TEI's OpenAI-style route)",
        bodies.OpenAIEmbeddingRequest, "As POST /v1/embeddings.", calls=(EMBED,),
        variants=(OPENAI_IMAGES, OPENAI_PARTS, OPENAI_LATE), batch=True),
    RouteSpec(
        "POST", "/v1/embed", cohere.cohere_embed_v1, "Embed texts (Cohere's v1)",
        cohere.CohereEmbedRequest, "Cohere's {id, texts, embeddings, meta}: by type, or bare "
        "floats without embedding_types.", calls=(EMBED,), batch=True),
    RouteSpec(
        "POST", "/v2/embed", cohere.cohere_embed_v2,
        "Embed texts (Cohere's v2); `inputs` of text and image content or `images` (a "
        "vision-language embedder's)", cohere.CohereEmbedRequest,
        "Cohere's {id, texts, embeddings: {float?, int8?, ..., base64?}, meta}.",
        calls=(EMBED,), variants=(Variant(parts.asks_cohere_images, parts.cohere_embed,
                                          parts.CohereMultimodalRequest, (EMBED_PARTS,)),),
        batch=True),
    RouteSpec(
        "POST", "/v1/multimodalembeddings", parts.voyage_embeddings,
        "Embed documents of text and image parts (Voyage's multimodal embeddings)",
        parts.VoyageRequest, "Voyage's {object: \"list\", data: [{object: \"embedding\", "
        "embedding, index}], model, usage: {text_tokens, image_pixels, total_tokens}}.",
        calls=(EMBED_PARTS,)),
    RouteSpec(
        "POST", "/v1/contextualizedembeddings", late_interaction.contextualized_embeddings,
        "Embed each chunk of each document in its document's context (Voyage's "
        "contextualized embeddings: late chunking)", late_interaction.ContextualizedRequest,
        "Voyage's {object: \"list\", data: [{object: \"list\", data: [{object: "
        "\"embedding\", embedding, index}], index}], model, usage: {total_tokens}}.",
        calls=(LATE_CHUNKS,)),
    RouteSpec(
        "POST", "/v2/rerank", cohere.cohere_v2_rerank,
        "Rerank documents against a query (Cohere's v2; documents of images or parts: a "
        "vision-language model's)", cohere.CohereRerankRequest,
        "Cohere's {id, results: [{index, relevance_score}], meta}.", calls=(RERANK,),
        variants=(_mixed_rerank(parts.rerank_v2),), batch=True),
    RouteSpec(
        "POST", "/embed_all", tei.embed_all, "Per-token vectors (Hugging Face TEI's)",
        bodies.EmbedAllRequest,
        "JSON: TEI's list, per text per token a list of floats. msgpack: {model, "
        "embeddings: [array per text], usage} in the numpy or portable layout.", ANY,
        (("outputs", OutputService.embed_all),), tei=True),
    RouteSpec(
        "POST", "/embed_multivector", late_interaction.embed_multivector,
        "A late-interaction (ColBERT) model's vectors per text: as queries or documents, "
        "pooled (`pool_factor`), or one MUVERA vector each (`muvera`)",
        late_interaction.EmbedMultiVectorRequest,
        "{model, dimension, muvera, embeddings: [per text (vectors, dimension), or one "
        "MUVERA row], usage}; msgpack: arrays in the numpy or portable layout.", ANY,
        (("late", LateInteractionService.embed_multi),)),
    RouteSpec(
        "POST", "/embed_sparse", tei.embed_sparse,
        "Sparse (SPLADE) vectors (Hugging Face TEI's)", bodies.EmbedSparseRequest,
        "JSON: TEI's list, per text its {index, value} entries in vocabulary order. "
        "msgpack: {model, dimension, embeddings: [{indices, values}], usage}.", ANY,
        (("outputs", OutputService.embed_sparse),), tei=True),
    RouteSpec(
        "POST", "/embed_hybrid", blitz_api.embed_hybrid,
        "A hybrid (bge-m3) model's dense, sparse and ColBERT outputs",
        blitz_api.EmbedHybridRequest,
        "{model, dense?, dimension?, sparse?, colbert?, usage}: the outputs asked for; "
        "msgpack: arrays in the numpy or portable layout.", ANY,
        (("outputs", OutputService.embed_hybrid),)),
    RouteSpec(
        "POST", "/similarity", tei.similarity,
        "Cosine similarity of sentences to a source sentence (Hugging Face TEI's)",
        bodies.SimilarityRequest, "One cosine per sentence: [float].", ANY,
        (("outputs", OutputService.similarity),), tei=True,
        variants=(Variant(bodies.has_image_inputs, images.similarity,
                      images.SimilarityImagesRequest,
                      (("images", ImageService.similarity_images),)),)),
    RouteSpec(
        "POST", "/predict", tei.predict, "Classify texts or text pairs (Hugging Face TEI's)",
        bodies.PredictRequest,
        "Per input a list of {score, label} best first (a flat list for one input).", ANY,
        (CLASSIFY,), tei=True),
    RouteSpec("POST", "/classify", infinity.classify, "Classify texts (Infinity's)",
              bodies.ClassifyRequest,
              "{object: \"classify\", data, model, usage, id, created}.", ANY, (CLASSIFY,)),
    RouteSpec("POST", "/tokenize", tei.tokenize, "Tokenize texts (Hugging Face TEI's)",
              bodies.TokenizeRequest, "Per text a list of {id, text, special, start, stop}.",
              ANY, (("tokens", TokenService.tokenize),), tei=True),
    RouteSpec("POST", "/decode", tei.decode, "Token ids back to text (Hugging Face TEI's)",
              bodies.DecodeRequest, "A list of texts, one per row of ids.", ANY,
              (("tokens", TokenService.decode),), tei=True),
    RouteSpec("POST", "/invocations", tei.tei_root, "SageMaker's: as POST /",
              bodies.EmbedRequest, _ROOT, ANY, _ROOT_CALLS),
    RouteSpec("POST", "/embeddings_image", images.openai_embeddings, "Embed images (Infinity's)",
              images.OpenAIImagesRequest, "As POST /v1/embeddings.",
              calls=(("images", ImageService.embed_images),)),
    RouteSpec("GET", "/models", infinity.models, "The served models (Infinity's list)", None,
              "{object: \"list\", data: [model]}: each model's id, kind, dimension, limits."),
    RouteSpec("GET", "/info", blitz_api.info,
              "One model's facts (Hugging Face TEI's /info, then Blitz's)", None,
              "TEI's fields for the default model (or ?model=), then every model and each "
              "pool's limits.", calls=(("service", status.info),)),
    RouteSpec("GET", "/v1/models", openai.openai_models, "The served models (OpenAI's list)",
              None, "{object: \"list\", data: [{id, object: \"model\", created, owned_by, "
              "kind, dimension, max_seq_length}]}."),
    RouteSpec("POST", "/v1/files", batches.upload_file,
              "Upload a batch's input (OpenAI's Files API): multipart/form-data with `file` "
              "(JSON lines, one request each) and `purpose: batch`", None, _FILE,
              calls=(("batches", BatchService.upload),), upload=True),
    RouteSpec("GET", "/v1/files", batches.list_files, "This key's files, newest first "
              "(`purpose`, `limit`, `after`, `order`)", None, _LIST,
              calls=(("batches", BatchService.list_files),)),
    RouteSpec("GET", "/v1/files/{file_id}", batches.retrieve_file, "One file's object", None,
              _FILE, calls=(("batches", BatchService.get_file),)),
    RouteSpec("DELETE", "/v1/files/{file_id}", batches.delete_file,
              "Delete a file (not the input of a batch still running)", None,
              "{id, object: \"file\", deleted: true}.",
              calls=(("batches", BatchService.delete_file),)),
    RouteSpec("GET", "/v1/files/{file_id}/content", batches.file_content,
              "A file's bytes: a batch's input, output or error lines", None,
              "The file, as JSON lines; an output line is {id, custom_id, response: "
              "{status_code, request_id, body}, error}.", ("application/octet-stream",),
              calls=(("batches", BatchService.file_content),)),
    RouteSpec("POST", "/v1/batches", batches.create_batch,
              "Run an uploaded file's requests as a batch (OpenAI's Batches API), at priority "
              "low beside interactive requests", batches.CreateBatchRequest, _BATCH,
              calls=(("batches", BatchService.create_batch),)),
    RouteSpec("GET", "/v1/batches", batches.list_batches,
              "This key's batches, newest first (`limit`, `after`)", None, _LIST,
              calls=(("batches", BatchService.list_batches),)),
    RouteSpec("GET", "/v1/batches/{batch_id}", batches.retrieve_batch,
              "One batch: its status and request_counts", None, _BATCH,
              calls=(("batches", BatchService.get_batch),)),
    RouteSpec("POST", "/v1/batches/{batch_id}/cancel", batches.cancel_batch,
              "Cancel a batch: it stops within seconds, its done requests kept in its output",
              None, _BATCH, calls=(("batches", BatchService.cancel_batch),)),
    RouteSpec("GET", "/health", blitz_api.health, "Liveness", None, _HEALTH, public=True),
    RouteSpec("GET", "/ready", blitz_api.ready,
              "Readiness: whether the default model can be served now", None,
              "200 with the facts when ready, else 503 (Retry-After); without a valid key "
              "while keys are on, the status alone.", public=True),
    # TEI answers GET / and GET /ping as /health: public like it (POST / takes a key); and
    # this API's description, public like TEI's /docs
    RouteSpec("GET", "/", blitz_api.health, "Liveness (Hugging Face TEI's)", None, _HEALTH,
              public=True, aside=True),
    RouteSpec("GET", "/ping", blitz_api.health, "Liveness (SageMaker's)", None, _HEALTH,
              public=True, aside=True),
    RouteSpec("GET", "/openapi.json", blitz_api.openapi, "This document", None,
              "OpenAPI 3.1, as JSON.", public=True, aside=True),
    RouteSpec("GET", "/docs", blitz_api.docs, "This document as a page", None,
              "Self-contained HTML.", ("text/html",), public=True, aside=True),
)


def batch_endpoints(routes: tuple[RouteSpec, ...] = ROUTES) -> list[str]:
    """The routes a batch's lines may call (``batch``), in the table's order."""
    return [route.path for route in routes if route.batch]


def service_calls(routes: tuple[RouteSpec, ...] = ROUTES) -> Iterator[Call]:
    """Every service call the routes make (their image variants' too), each once."""
    seen: set[Callable[..., Any]] = set()
    for route in routes:
        for holder, function in (*route.calls, *(c for v in route.variants for c in v.calls)):
            if function not in seen:
                seen.add(function)
                yield holder, function
