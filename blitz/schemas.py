"""Every wire schema, defined once: request bodies, handle results and jobs sent to pools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from blitz.errors import BadRequest, InvalidValue
from blitz.postprocess import OutputDtype


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @classmethod
    def parse(cls, payload: Any) -> Any:
        """Validate a decoded body; a non-object is a 400, bad values a 422 naming the field."""
        if not isinstance(payload, dict):
            raise BadRequest(f"request body must be an object, not {type(payload).__name__}")
        try:
            return cls.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = first["loc"]  # drop union-member names pydantic puts in the path
            where = "".join([str(loc[0]) if loc else "body",
                             *(f"[{p}]" for p in loc[1:] if isinstance(p, int))])
            raise InvalidValue(f"{where}: {first['msg']}", param=where) from None


class EmbedRequest(_Request):
    """``POST /embed``."""

    texts: str | list[str] = Field(validation_alias=AliasChoices("texts", "inputs"),
                                   description="one text or a list")
    model: str | None = Field(None, description="model id; header or default when absent")
    normalize: bool | None = Field(None, description="unit-length rows; default per model")
    truncate: bool = Field(True, description="cut to max_seq_length; false: 413 if too long")
    dimensions: int | None = Field(None, gt=0, description="Matryoshka: keep the first N")
    dtype: OutputDtype = Field("float32", description="float32|float16|int8|uint8|binary|ubinary")
    prompt_name: str | None = Field(None, description="a prompt from the model's spec")


class OpenAIEmbeddingRequest(_Request):
    """``POST /v1/embeddings`` (OpenAI's shape)."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="text, texts, token ids, or lists of token ids")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _no_mixed_lists(cls, value: Any) -> Any:
        if isinstance(value, list) and value:
            kinds = {type(v).__name__ for v in value}
            if len(kinds) > 1:
                raise ValueError("input must not mix strings, token ids and token-id lists")
        return value


class RerankRequest(_Request):
    """``POST /rerank`` and ``POST /v1/rerank`` (Cohere/Jina shape)."""

    query: str
    documents: list[str] = Field(validation_alias=AliasChoices("documents", "texts"))
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False
    truncate: bool = True

    @field_validator("documents", mode="before")
    @classmethod
    def _document_objects(cls, value: Any) -> Any:
        """Cohere also sends documents as ``{"text": ...}`` objects."""
        if isinstance(value, list):
            return [d["text"] if isinstance(d, dict) and "text" in d else d for d in value]
        return value


# ---- pool jobs (ingress -> pool) ----------------------------------------------------------

@dataclass(frozen=True)
class EmbedJob:
    """Texts (or token ids) for one pool call; never larger than the pool's batch limit."""

    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    normalize: bool = True
    truncate: bool = True

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or ())


@dataclass(frozen=True)
class RerankJob:
    query: str
    documents: list[str]
    truncate: bool = True

    def __len__(self) -> int:
        return len(self.documents)


# ---- results (handle API and HTTP replies) ------------------------------------------------

@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, tokens: int) -> Usage:
        return cls(prompt_tokens=tokens, total_tokens=tokens)

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "total_tokens": self.total_tokens}


@dataclass(frozen=True)
class EmbedResult:
    """What ``handle.embed.remote(...)`` returns: the array plus usage."""

    embeddings: np.ndarray
    model: str
    usage: Usage
    pool: str = "cpu"

    def to_native(self) -> dict[str, Any]:
        return {"model": self.model, "embeddings": self.embeddings,
                "shape": list(self.embeddings.shape), "dtype": str(self.embeddings.dtype),
                "usage": self.usage.to_dict()}


@dataclass(frozen=True)
class RerankHit:
    index: int
    relevance_score: float
    document: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "relevance_score": self.relevance_score}
        if self.document is not None:
            out["document"] = {"text": self.document}
        return out


@dataclass(frozen=True)
class RerankResult:
    """What ``handle.rerank.remote(...)`` returns: hits sorted by score, best first."""

    results: list[RerankHit]
    model: str
    usage: Usage
    pool: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "results": [h.to_dict() for h in self.results],
                "usage": self.usage.to_dict()}
