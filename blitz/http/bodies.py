"""The HTTP request bodies, one pydantic model per route, defined once.

``Model.parse(payload, limits)`` validates a decoded body (``blitz.codecs``): a
non-object is a 400, a list over the limits a 413 naming the limit (counted before
anything else), a bad value a 422 naming the field. Numbers and booleans are strict
(``true`` is not ``1``). What the ingress does with them is ``blitz.ingress.service``'s;
what the reply looks like is ``blitz.http.reply_bodies``'s; the jobs and results that cross
the hops are ``blitz.hop_messages``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)

from blitz.codecs import ArrayLayout
from blitz.encoders.postprocess import OutputDtype
from blitz.errors import BadRequest, InvalidValue, echo
from blitz.hop_messages import PRIORITY_HELP, EmbedOptions, PriorityName
from blitz.http.long_inputs import LongInputs, TruncationSide
from blitz.ingress.limits import check_count, check_token_total

if TYPE_CHECKING:
    from blitz.settings.config import Limits


class _Request(BaseModel):
    """A request body. Numbers and booleans are strict (``true`` is not ``1``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    priority: PriorityName | None = Field(None, description=PRIORITY_HELP)  # take_priority
    # body keys holding one item per text: counted before validation, so that a hostile
    # list costs one len() instead of one validation error per item
    _list_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def parse(cls, payload: Any, limits: Limits | None = None) -> Any:
        """Validate a decoded body; a non-object is a 400, bad values a 422 naming the field,
        a list over ``limits`` a 413 naming the limit (checked before anything else)."""
        if not isinstance(payload, dict):
            raise BadRequest(f"request body must be an object, not {type(payload).__name__}")
        if limits is not None:
            cls._check_sizes(payload, limits)
        try:
            return cls.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = first["loc"]  # drop union-member names pydantic puts in the path
            where = "".join([str(loc[0]) if loc else "body",
                             *(f"[{p}]" for p in loc[1:] if isinstance(p, int))])
            raise InvalidValue(f"{where}: {first['msg']}", param=where) from None

    @classmethod
    def _check_sizes(cls, payload: dict, limits: Limits) -> None:
        for key in cls._list_keys:
            items = payload.get(key)
            if isinstance(items, list):
                check_count(len(items), limits, key, key)


def _texts_or_ids_shape(value: Any, field: str) -> Any:
    """Check a texts-or-token-ids input in one pass that stops at the first bad item (a
    union would build an error per item per member); booleans are not token ids."""
    if not isinstance(value, list) or not value:
        return value
    first = type(value[0])
    if first is str:
        bad = next((i for i, v in enumerate(value) if type(v) is not str), None)
    elif first is int:
        bad = next((i for i, v in enumerate(value) if type(v) is not int), None)
    elif first is list:
        bad = next((i for i, row in enumerate(value)
                    if type(row) is not list or not all(type(t) is int for t in row)), None)
    else:
        bad = 0
    if bad is not None:
        raise ValueError(f"item {bad} does not fit: {field} must be a string, a list of "
                         "strings, a list of token ids (integers) or a list of token-id "
                         "lists, all items alike")
    return value


def _split_texts_or_ids(items: Any) -> tuple[list[str], None] | tuple[None, list[list[int]]]:
    """A checked input as ``(texts, None)`` or ``(None, token-id rows)``: a string is one
    text, a list of integers one row of token ids."""
    if isinstance(items, str):
        return [items], None
    if items and isinstance(items[0], int):
        return None, [items]
    if items and isinstance(items[0], list):
        return None, items
    return items, None


def _count_token_ids(items: Any, field: str, limits: Limits) -> None:
    """413 when a texts-or-token-ids input is over the limits (counted before validation)."""
    if not isinstance(items, list) or not items:
        return
    if not isinstance(items[0], int):
        check_count(len(items), limits, "inputs", field)
    if isinstance(items[0], list):
        total = sum(len(row) if isinstance(row, list) else 1 for row in items)
    elif isinstance(items[0], int):
        total = len(items)
    else:
        return
    check_token_total(total, limits, field)


_INSTRUCTION = ("a free-form task put in the model's instruction_template before each text "
                "(instead of prompt_name)")

# fail_fast: a union member stops at its first bad item instead of building an error per item
_Texts = Annotated[list[str], Field(fail_fast=True)]
_TokenIds = Annotated[list[StrictInt], Field(fail_fast=True)]
_TokenIdRows = Annotated[list[_TokenIds], Field(fail_fast=True)]


class EmbedRequest(_Request, TruncationSide, LongInputs):
    """``POST /embed``: Blitz's ``texts``, or Hugging Face TEI's ``inputs`` (which may also
    be token ids, as TEI takes them)."""

    _list_keys = ()  # texts or token ids: counted in _check_sizes
    _sides = ("left", "right")

    texts: str | _Texts | _TokenIds | _TokenIdRows = Field(
        validation_alias=AliasChoices("texts", "inputs"),
        description="one text, a list of texts, token ids, or lists of token ids")
    model: str | None = Field(None, description="model id; header or default when absent")
    normalize: StrictBool | None = Field(None, description="unit-length rows; default per model")
    truncate: StrictBool = Field(True, description="cut to max_seq_length; false: 413 if too long")
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="cut the start (left) or the end (right); default: the model's")
    dimensions: StrictInt | None = Field(None, gt=0, description="Matryoshka: keep the first N")
    dtype: OutputDtype = Field("float32", description="float32|float16|int8|uint8|binary|ubinary")
    prompt_name: str | None = Field(None, description="a prompt from the model's spec")
    instruction: str | None = Field(None, description=_INSTRUCTION)
    layout: ArrayLayout | None = Field(
        None, description="msgpack reply's array layout: numpy (msgpack-numpy, default) or "
        "portable (string keys, any language); overrides Accept's layout parameter")
    return_chunks: StrictBool = Field(
        False, description="chunk each text (long_inputs chunk) and answer, beside its mean, "
        "its windows' vectors and [start, end) character offsets (`chunks`)")

    @classmethod
    def _check_sizes(cls, payload: dict, limits: Limits) -> None:
        _count_token_ids(payload.get("texts", payload.get("inputs")), "texts", limits)

    @field_validator("texts", mode="before")
    @classmethod
    def _one_shape(cls, value: Any) -> Any:
        return _texts_or_ids_shape(value, "inputs")

    def texts_or_token_ids(self) -> tuple[list[str], None] | tuple[None, list[list[int]]]:
        """``texts`` as ``(texts, None)`` or ``(None, token-id rows)``."""
        return _split_texts_or_ids(self.texts)

    def options(self) -> EmbedOptions:
        """The options, as the service takes them (the side: ``truncation_side``, else TEI's
        ``truncation_direction``)."""
        return EmbedOptions(self.normalize, self.truncate, self.truncation_side
                            or self.truncation_direction, self.long_inputs,
                            self.return_chunks, self.dimensions, self.dtype,
                            self.prompt_name, self.instruction)


class OpenAIEmbeddingRequest(_Request, LongInputs):
    """``POST /v1/embeddings`` (OpenAI's shape)."""

    _list_keys = ()  # ``input`` is a list of texts or of token ids: counted below

    input: str | _Texts | _TokenIds | _TokenIdRows = Field(
        description="text, texts, token ids, or lists of token ids")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, gt=0)
    user: str | None = None
    modality: str = Field("text", description="Infinity's: text, or image (a dual "
                          "encoder's images: blitz.http.routes.images)")
    prompt_name: str | None = Field(None, description="Blitz's: a prompt from the model's spec")
    instruction: str | None = Field(None, description="Blitz's: " + _INSTRUCTION)
    return_chunks: Any = None

    @field_validator("return_chunks")
    @classmethod
    def _one_vector_each(cls, value: Any) -> Any:
        if value not in (None, False):
            raise ValueError("is not served on OpenAI's embeddings (one vector per input): "
                             "send long_inputs chunk for the mean, or POST /embed for chunks")
        return value

    @field_validator("dimensions", mode="before")
    @classmethod
    def _zero_is_full(cls, value: Any) -> Any:
        """Infinity's client sends ``dimensions: 0`` for "the model's own": the same as
        leaving it out (OpenAI's own API refuses 0; a negative number is still a 422)."""
        return None if value == 0 and type(value) is int else value

    @field_validator("modality")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"modality {echo(value)!r} is not served: send text or "
                             "image, or leave modality out")
        return value

    @classmethod
    def _check_sizes(cls, payload: dict, limits: Limits) -> None:
        _count_token_ids(payload.get("input"), "input", limits)

    @field_validator("input", mode="before")
    @classmethod
    def _one_shape(cls, value: Any) -> Any:
        return _texts_or_ids_shape(value, "input")

    def texts_or_token_ids(self) -> tuple[list[str], None] | tuple[None, list[list[int]]]:
        """``input`` as ``(texts, None)`` or ``(None, token-id rows)``."""
        return _split_texts_or_ids(self.input)


class RerankRequest(_Request, TruncationSide):
    """``POST /rerank`` (Infinity's ``documents``, or Hugging Face TEI's ``texts``),
    ``/v1/rerank`` (Cohere's v1 and Jina's) and ``/v2/rerank`` (Cohere's v2)."""

    _list_keys = ("documents", "texts")

    query: str
    documents: _Texts = Field(validation_alias=AliasChoices("documents", "texts"))
    model: str | None = None
    top_n: StrictInt | None = Field(None, ge=1)
    return_documents: StrictBool = Field(False, validation_alias=AliasChoices(
        "return_documents", "return_text"), description="TEI calls it return_text")
    truncate: StrictBool = True
    raw_scores: StrictBool = Field(False, description="TEI's: scores before the model's "
                                   "activation (cross-encoders)")

    @field_validator("documents", mode="before")
    @classmethod
    def _document_objects(cls, value: Any) -> Any:
        """Cohere also sends documents as ``{"text": ...}`` objects."""
        if isinstance(value, list):
            return [d["text"] if isinstance(d, dict) and "text" in d else d for d in value]
        return value


class EmbedAllRequest(_Request, LongInputs):
    """``POST /embed_all`` (Hugging Face TEI's shape)."""

    _list_keys = ("inputs", "texts")

    texts: str | _Texts = Field(validation_alias=AliasChoices("inputs", "texts"),
                                description="one text or a list")
    model: str | None = None
    truncate: StrictBool = True
    prompt_name: str | None = None
    layout: ArrayLayout | None = Field(None, description="msgpack reply's array layout")


class EmbedSparseRequest(EmbedAllRequest):
    """``POST /embed_sparse`` (Hugging Face TEI's shape), ``/embed_all``'s fields.
    ``dtype`` and ``dimensions`` do not apply to sparse vectors: sent, they are a 422
    saying so."""

    dtype: Any = None
    dimensions: Any = None

    @field_validator("dtype", "dimensions")
    @classmethod
    def _not_for_sparse(cls, value: Any, info: Any) -> Any:
        if value is not None:
            raise ValueError(f"{info.field_name} does not apply to sparse embeddings (their "
                             "weights are float32 over the whole vocabulary); leave it out")
        return value


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source_sentence: str
    sentences: _Texts


class SimilarityParameters(BaseModel):
    model_config = ConfigDict(extra="ignore")

    truncate: StrictBool | None = None
    prompt_name: str | None = None


class SimilarityRequest(_Request):
    """``POST /similarity`` (Hugging Face TEI's shape): ``{inputs: {source_sentence,
    sentences}, parameters?: {truncate, prompt_name}, model?}``."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
    model: str | None = None

    @classmethod
    def _check_sizes(cls, payload: dict, limits: Limits) -> None:
        inputs = payload.get("inputs")
        sentences = inputs.get("sentences") if isinstance(inputs, dict) else None
        if isinstance(sentences, list):
            check_count(len(sentences), limits, "sentences and a source", "inputs.sentences",
                        plus=1)


class PredictRequest(_Request):
    """``POST /predict`` (Hugging Face TEI's shape): ``inputs`` is one text, ``[text]``,
    one pair ``[text, text]``, or a batch ``[[text], [text, text], ...]``."""

    _list_keys = ("inputs",)

    inputs: str | Annotated[list[str], Field(min_length=1, max_length=2)] | Annotated[
        list[Annotated[list[str], Field(min_length=1, max_length=2)]],
        Field(min_length=1, fail_fast=True)]
    model: str | None = None
    raw_scores: StrictBool = False
    truncate: StrictBool = True
    top_k: StrictInt | None = Field(None, ge=1)

    def batch(self) -> tuple[list[list[str]], bool]:
        """(inputs as one-text or pair lists, whether the request was one input)."""
        if isinstance(self.inputs, str):
            return [[self.inputs]], True
        if all(isinstance(i, str) for i in self.inputs):
            return [list(self.inputs)], True  # type: ignore[arg-type]
        return [list(i) for i in self.inputs], False


class ClassifyRequest(_Request):
    """``POST /classify`` (Infinity's shape)."""

    _list_keys = ("input",)

    input: str | _Texts
    model: str | None = None
    raw_scores: StrictBool = False
    truncate: StrictBool = True
    top_k: StrictInt | None = Field(None, ge=1)


class TokenizeRequest(_Request):
    """``POST /tokenize`` (Hugging Face TEI's shape)."""

    _list_keys = ("inputs", "texts")

    texts: str | _Texts = Field(validation_alias=AliasChoices("inputs", "texts"),
                                description="one text or a list")
    model: str | None = None
    add_special_tokens: StrictBool = True
    prompt_name: str | None = None
    return_offsets: StrictBool = Field(True, description="each token's start and stop")
    offsets: Literal["chars", "bytes"] = Field(
        "chars", description="offsets in characters, or UTF-8 bytes as TEI counts them")


class DecodeRequest(_Request):
    """``POST /decode`` (Hugging Face TEI's shape)."""

    _list_keys = ("ids",)

    ids: _TokenIds | _TokenIdRows = Field(description="token ids, or a list of such lists")
    model: str | None = None
    skip_special_tokens: StrictBool = True

    @classmethod
    def _check_sizes(cls, payload: dict, limits: Limits) -> None:
        ids = payload.get("ids")
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            check_count(len(ids), limits, "rows of ids", "ids")
            total = sum(len(row) if isinstance(row, list) else 1 for row in ids)
        else:
            total = len(ids) if isinstance(ids, list) else 0
        check_token_total(total, limits, "ids")

    @field_validator("ids", mode="before")
    @classmethod
    def _one_shape(cls, value: Any) -> Any:
        """One pass that stops at the first bad item (booleans are not token ids)."""
        if not isinstance(value, list) or not value:
            return value
        if type(value[0]) is list:
            bad = next((i for i, row in enumerate(value)
                        if type(row) is not list or not all(type(t) is int for t in row)), None)
        else:
            bad = next((i for i, v in enumerate(value) if type(v) is not int), None)
        if bad is not None:
            raise ValueError(f"item {bad} does not fit: ids must be a list of token ids "
                             "(integers) or a list of token-id lists")
        return value


# ---- what a body asks for (a route with an image variant: blitz.http.routes.table) --

def has_images(payload: Any) -> bool:
    """``/embed``'s and ``/rerank``'s bodies ask for images with ``images``."""
    return isinstance(payload, dict) and "images" in payload


def image_modality(payload: Any) -> bool:
    """OpenAI's embeddings bodies ask for images with ``modality: "image"`` (Infinity's)."""
    return isinstance(payload, dict) and payload.get("modality") == "image"


def has_image_inputs(payload: Any) -> bool:
    """``/similarity``'s bodies ask for images with ``inputs: {source_sentence, images}``."""
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    return isinstance(inputs, dict) and "images" in inputs
