"""A request's cost budget: every limit (``blitz.settings.config.Limits``) in one table,
and the checks that count a request against it before any work is queued.

``BUDGET`` names each limit's setting and what it counts; a request over one is a 413
naming the limit, the field and the index (``over``), a bad value a 422 naming the field.
What a request costs is counted as cheaply as its work allows: texts and characters where
truncation bounds the work (the common case: nothing is tokenized here), windows with the
model's tokenizer where chunking makes the cost depend on them (``count_windows``; the
texts that fit one window by their bytes are not tokenized), token vectors likewise
(``blitz.ingress.other_outputs``). Queues and batchers count what the budget counted: a
chunked job's units are its windows (``blitz.hop_messages.units_of``).

The HTTP bodies count their lists with ``check_count`` and ``check_token_total`` before
validation (``blitz.http.bodies``); the service checks every request's texts and token
ids with ``check_texts`` and ``check_token_ids``, for HTTP, gRPC and handle calls alike.
Each model kind's cost is its row's ``cost`` in ``blitz.settings.kinds`` (``KIND_COSTS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from blitz.errors import InvalidValue, PayloadTooLarge
from blitz.settings.kinds import KINDS, KindCost

if TYPE_CHECKING:
    from blitz.settings.config import Limits


class Limit(NamedTuple):
    """One row of the budget: what the setting ``limits.<name>`` counts, and over what."""

    counts: str
    per: str


BUDGET: dict[str, Limit] = {
    "max_texts_per_request": Limit("texts, rerank documents, rows of token ids, inputs",
                                   "request"),
    "max_chars_per_text": Limit("characters of one text, its prompt or instruction "
                                "included (token ids of one row)", "text"),
    "max_instruction_chars": Limit("characters of the free-form `instruction`", "request"),
    "max_token_ids_per_request": Limit("token ids, all rows together", "request"),
    "max_windows_per_request": Limit("windows of chunked texts (a text within the model's "
                                     "length is one), counted with the model's tokenizer",
                                     "request"),
    "max_tokens_per_request": Limit("tokens a /tokenize request gives", "request"),
    "max_token_vectors_per_request": Limit("token vectors (/embed_all, bge-m3's ColBERT "
                                           "output), counted with the model's tokenizer",
                                           "request"),
    "max_visual_tokens_per_request": Limit("visual tokens of a vision-language model's "
                                           "images, counted from their declared sizes",
                                           "request"),
    "max_top_n": Limit("a rerank request's `top_n`", "request"),
    "max_body_bytes": Limit("bytes of a request body, as sent", "request"),
    # images (``blitz.settings.images``; refused in ``blitz.images``, below this floor)
    "images.max_per_request": Limit("images", "request"),
    "images.max_bytes": Limit("bytes of one encoded image", "image"),
    "images.max_pixels": Limit("pixels one image's header declares", "image"),
    "images.max_request_pixels": Limit("declared pixels, all images together, summed "
                                       "before any decode", "request"),
    "images.max_job_pixels": Limit("declared pixels of one pool call (its queue units: an "
                                   "image or a megapixel each)", "job"),
    "images.max_fetch_bytes_in_flight": Limit("bytes of image URLs being fetched",
                                              "ingress replica"),
}
"""Every request limit, by its setting (``limits.<name>``, or ``images.<name>``);
docs/reliability.md ("The cost budget") prints this table."""

KIND_COSTS: dict[str, KindCost] = {name: row.cost for name, row in KINDS.items()}
"""What a request to each model kind costs: the ``cost`` column of the kind table
(``blitz.settings.kinds.KINDS``), which the budget's checks read."""


def over(setting: str, have: str, limit: int, param: str) -> PayloadTooLarge:
    """The one wording of a request over a limit: what it has, then the limit's name and
    value; ``param`` names the field."""
    assert setting in BUDGET, setting
    return PayloadTooLarge(f"{have}; the limit {setting} is {limit}", param=param)


def check_count(count: int, limits: Limits, noun: str, param: str, *, plus: int = 0) -> None:
    """413 when ``count`` items (``noun``: "texts", "rows of ids") and ``plus`` more
    are over ``limits.max_texts_per_request``; ``param`` names the field."""
    if count + plus > limits.max_texts_per_request:
        raise over("max_texts_per_request", f"{count} {noun} in one request",
                   limits.max_texts_per_request, param)


def check_length(length: int, limits: Limits, where: str, param: str,
                 unit: str = "characters") -> None:
    """413 when the input at ``where`` ("texts[3]", "query") has more than
    ``limits.max_chars_per_text`` ``unit``."""
    if length > limits.max_chars_per_text:
        raise over("max_chars_per_text", f"{where} has {length} {unit}",
                   limits.max_chars_per_text, param)


def check_token_total(total: int, limits: Limits, param: str) -> None:
    """413 when one request's token ids, all rows together, are over
    ``limits.max_token_ids_per_request``."""
    if total > limits.max_token_ids_per_request:
        raise over("max_token_ids_per_request", f"{total} token ids in one request",
                   limits.max_token_ids_per_request, param)


def check_texts(texts: list[str], limits: Limits, what: str = "texts") -> None:
    """``texts`` (the field ``what``) hold one to ``max_texts_per_request`` non-blank
    strings of at most ``max_chars_per_text`` characters each."""
    if not texts:
        raise InvalidValue(f"{what} must contain at least one text", param=what)
    check_count(len(texts), limits, what, what)
    longest = limits.max_chars_per_text
    for i, text in enumerate(texts):  # the hot path: no call and no string per good text
        if not isinstance(text, str):
            raise InvalidValue(f"{what}[{i}] must be a string", param=what)
        if len(text) > longest:
            check_length(len(text), limits, f"{what}[{i}]", what)
        if not text.strip():
            raise InvalidValue(f"{what}[{i}] is empty", param=what)


def check_prompted(texts: list[str], prefix: int, limits: Limits, what: str = "texts",
                   instruction: str | None = None) -> None:
    """The request's ``instruction`` within ``max_instruction_chars``, and each of ``texts``
    (checked alone by ``check_texts``) with the ``prefix`` characters of its prompt or
    instruction before it within ``max_chars_per_text``: a long prefix is counted before
    it is copied before every text."""
    if instruction is not None and len(instruction) > limits.max_instruction_chars:
        raise over("max_instruction_chars", f"instruction has {len(instruction)} characters",
                   limits.max_instruction_chars, "instruction")
    if prefix and texts:
        i = max(range(len(texts)), key=lambda k: len(texts[k]))
        if prefix + len(texts[i]) > limits.max_chars_per_text:
            raise over("max_chars_per_text", f"{what}[{i}] has {prefix + len(texts[i])} "
                       "characters with its prompt or instruction",
                       limits.max_chars_per_text, what)


def check_token_ids(token_ids: list[list[int]], limits: Limits, what: str = "input") -> None:
    """``token_ids`` (the field ``what``) hold one to ``max_texts_per_request`` non-empty
    rows, each of at most ``max_chars_per_text`` ids, and ``max_token_ids_per_request``
    ids in all."""
    if not token_ids or any(len(row) == 0 for row in token_ids):
        raise InvalidValue(f"{what} must contain at least one token id per item", param=what)
    check_count(len(token_ids), limits, "inputs", what)
    total = 0
    for i, row in enumerate(token_ids):
        if len(row) > limits.max_chars_per_text:
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
            raise over("max_top_n", f"top_n={top_n}", limits.max_top_n, "top_n")
    return documents


# ---- windows of chunked texts ----------------------------------------------------------

class Window(NamedTuple):
    """A model's chunking: each window holds ``room`` of a text's own tokens (its length
    less the special tokens) and starts ``step`` tokens after the one before it."""

    room: int
    step: int


def windows_of(tokens: int, window: Window) -> int:
    """How many windows a text of ``tokens`` own tokens is cut into (as
    ``blitz.encoders.bi_encoder.BiEncoder.chunks`` cuts it)."""
    return -(-max(tokens - window.room, 0) // window.step) + 1


def most_tokens(text: str) -> int:
    """More tokens than any tokenizer Blitz serves makes of ``text``: a token is at least
    one byte of it (WordPiece, BPE, byte-level BPE), or a word marker beside one."""
    return 2 * (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))) + 1


GROUP_CHARS = 65_536  # texts are tokenized in groups of about this many characters


def count_windows(texts: list[str], window: Window, limits: Limits,
                  tokens: Callable[[list[str]], list[int]] | None,
                  what: str = "texts") -> list[int]:
    """Each text's windows, 413 naming the text at which they pass
    ``limits.max_windows_per_request``. A text whose bytes fit one window is one, untokenized;
    the others are tokenized with ``tokens`` (each text's own token count, no specials) in
    groups, stopping at the first group past the limit; without a tokenizer (the model's files
    are not on this machine) they are counted by ``most_tokens``, an upper bound."""
    limit = limits.max_windows_per_request
    counts = [1 if most_tokens(t) <= window.room else 0 for t in texts]
    total = counts.count(1)
    if total > limit:
        raise _too_many_windows(total, limit, None, what)
    longer = [k for k, n in enumerate(counts) if not n]
    start = 0
    while start < len(longer):
        group: list[int] = []
        held = 0
        while start < len(longer) and (not group or held < GROUP_CHARS):
            group.append(longer[start])
            held += len(texts[longer[start]])
            start += 1
        sizes = (tokens([texts[k] for k in group]) if tokens is not None
                 else [most_tokens(texts[k]) for k in group])
        for k, size in zip(group, sizes, strict=True):
            counts[k] = windows_of(size, window)
            total += counts[k]
            if total > limit:
                raise _too_many_windows(total, limit, k, what)
    return counts


def _too_many_windows(total: int, limit: int, at: int | None, what: str) -> PayloadTooLarge:
    where = f" by {what}[{at}]" if at is not None else ""
    return over("max_windows_per_request",
                f"the chunked texts give more than {limit} windows{where} ({total} counted so "
                "far)", limit, what)


def in_jobs(units: list[int], size: int) -> list[tuple[int, int, int]]:
    """Consecutive items of ``units`` each grouped into (start, stop, units) jobs of at most
    ``size`` units (an item of more is a job alone)."""
    jobs: list[tuple[int, int, int]] = []
    start, held = 0, 0
    for k, n in enumerate(units):
        if k > start and held + n > size:
            jobs.append((start, k, held))
            start, held = k, 0
        held += n
    if units:
        jobs.append((start, len(units), held))
    return jobs


J = TypeVar("J")


def weighed(units: dict[Any, int], make_job: Callable[[Any, list[Any]], J]
            ) -> tuple[Callable[[list[Any], int], list[list[Any]]], Callable[[Any, list[Any]], J]]:
    """A request's items in jobs of at most the batch limit in ``units`` (each item's:
    ``in_jobs``), and ``make_job`` giving each job its units (``blitz.hop_messages.units_of``)."""
    def split(some: list[Any], size: int) -> list[list[Any]]:
        return [some[a:b] for a, b, _ in in_jobs([units[x] for x in some], size)]

    def made(spec: Any, part: list[Any]) -> J:
        job = make_job(spec, part)
        return dataclasses.replace(job, units=sum(units[x] for x in part))  # type: ignore[type-var]

    return split, made
