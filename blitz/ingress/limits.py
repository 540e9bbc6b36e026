"""The request limits (``blitz.settings.config.Limits``) as checks, each refusal worded
once: a request over one is a 413 naming the limit, a bad value a 422 naming the field.

The HTTP bodies count their lists with ``check_count`` and ``check_token_total`` before
validation (``blitz.http.bodies``); the service checks every request's texts and token
ids with ``check_texts`` and ``check_token_ids``, for HTTP, gRPC and handle calls alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blitz.errors import InvalidValue, PayloadTooLarge

if TYPE_CHECKING:
    from blitz.settings.config import Limits


def check_count(count: int, limits: Limits, noun: str, param: str, *, plus: int = 0) -> None:
    """413 when ``count`` items (``noun``: "texts", "rows of ids") and ``plus`` more
    are over ``limits.max_texts_per_request``; ``param`` names the field."""
    if count + plus > limits.max_texts_per_request:
        raise PayloadTooLarge(
            f"{count} {noun} in one request; the limit max_texts_per_request is "
            f"{limits.max_texts_per_request}", param=param)


def check_length(length: int, limits: Limits, where: str, param: str,
                 unit: str = "characters") -> None:
    """413 when the input at ``where`` ("texts[3]", "query") has more than
    ``limits.max_chars_per_text`` ``unit``."""
    if length > limits.max_chars_per_text:
        raise PayloadTooLarge(
            f"{where} has {length} {unit}; the limit max_chars_per_text is "
            f"{limits.max_chars_per_text}", param=param)


def check_token_total(total: int, limits: Limits, param: str) -> None:
    """413 when one request's token ids, all rows together, are over
    ``limits.max_token_ids_per_request``."""
    if total > limits.max_token_ids_per_request:
        raise PayloadTooLarge(
            f"{total} token ids in one request; the limit max_token_ids_per_request is "
            f"{limits.max_token_ids_per_request}", param=param)


def check_texts(texts: list[str], limits: Limits, what: str = "texts") -> None:
    """``texts`` (the field ``what``) hold one to ``max_texts_per_request`` non-blank
    strings of at most ``max_chars_per_text`` characters each."""
    if not texts:
        raise InvalidValue(f"{what} must contain at least one text", param=what)
    check_count(len(texts), limits, what, what)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidValue(f"{what}[{i}] must be a string", param=what)
        check_length(len(text), limits, f"{what}[{i}]", what)
        if not text.strip():
            raise InvalidValue(f"{what}[{i}] is empty", param=what)


def check_token_ids(token_ids: list[list[int]], limits: Limits, what: str = "input") -> None:
    """``token_ids`` (the field ``what``) hold one to ``max_texts_per_request`` non-empty
    rows, each of at most ``max_chars_per_text`` ids, and ``max_token_ids_per_request``
    ids in all."""
    if not token_ids or any(len(row) == 0 for row in token_ids):
        raise InvalidValue(f"{what} must contain at least one token id per item", param=what)
    check_count(len(token_ids), limits, "inputs", what)
    total = 0
    for i, row in enumerate(token_ids):
        check_length(len(row), limits, f"{what}[{i}]", what, "token ids")
        total += len(row)
    check_token_total(total, limits, what)


def check_rerank(query: str, documents: list[str], top_n: int | None,
                 limits: Limits) -> list[str]:
    """``documents``, once the query, they and ``top_n`` are within ``limits``."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidValue("query must be a non-empty string", param="query")
    check_length(len(query), limits, "query", "query")
    check_texts(documents, limits, "documents")
    if top_n is not None:
        if top_n < 1:
            raise InvalidValue("top_n must be at least 1", param="top_n")
        if top_n > limits.max_top_n:
            raise PayloadTooLarge(f"top_n={top_n}; the limit max_top_n is "
                                  f"{limits.max_top_n}", param="top_n")
    return documents
