"""What every bi-encoder backend shares: tokenizing, micro-batching, normalizing.

``BiEncoder`` leaves one thing to its backends: ``_forward``, one padded model call
(``blitz.encoders.sentence_transformer``: torch, or onnxruntime through
sentence-transformers; ``blitz.encoders.onnx_native``: onnxruntime alone).

Texts are tokenized once, sorted by length and run in micro-batches that fit a token
budget, so short texts are not padded to the longest one in the request. A micro-batch
also ends where widening it to the next text would pad more tokens than a model call of
its own costs: that fixed cost, in tokens, is measured once after loading
(``calibrate``). On a CPU it is small (tens of tokens for MiniLM), so a handful of texts
of mixed lengths runs as a few calls of similar lengths instead of one call padded to the
longest (calls of up to ``SPLIT_MAX_TEXTS`` texts: the micro-batches of single-text
traffic); on a GPU it is larger than the token budget and only the budget splits.

``rows_per_call`` caps the texts per model call: ``1`` for dynamically quantized int8,
whose activation scales are computed per call over the whole padded batch, so a text's
vector would depend on what it was batched with. Run alone, every text gets the same
vector whatever shares its request or micro-batch (docs/benchmarks-history.md, "int8
runs each text alone").
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from typing import Any, NamedTuple

import numpy as np

from blitz.encoders.base import Encoded, Encoder, TextJob, check_lengths, l2_normalize
from blitz.encoders.token_ids import TokenIds
from blitz.errors import InvalidValue


class BiEncoder(Encoder):
    """An embedding model: ``tokens`` turns texts into ids, ``_forward`` ids into vectors."""

    kind = "embedding"
    capabilities = frozenset({"embed", "embed_tokens", "embed_all", "score", "long_inputs",
                              "late_chunks"})

    def __init__(self, model_id: str, tokens: TokenIds, *, max_seq_length: int,
                 dimension: int, device: str, token_budget: int, rows_per_call: int = 0):
        super().__init__(model_id, max_seq_length)
        self.tokens = tokens
        self.device = device
        self.token_budget = token_budget
        self.rows_per_call = rows_per_call  # 0: as many as the token budget allows
        self.call_tokens = math.inf  # a model call's fixed cost in tokens, once calibrated
        self.truncation_side: str | None = None  # left | right; None: the tokenizer's own
        self.long_inputs = "truncate"  # truncate | error | chunk (a model's spec says)
        self.chunk_overlap = 0  # tokens each chunk shares with the one before it
        self._dimension = dimension

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,
                  images: Any) -> None:
        self.token_budget = max_batch_tokens  # the pool's memory budget allows this many

    @property
    def dimension(self) -> int:
        return self._dimension

    @abstractmethod
    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        """One model call: ``rows`` (ids with specials) padded to ``width``; float32
        sentence embeddings as the model's own modules give them (normalized if the model
        ends in normalization)."""

    def _forward_tokens(self, rows: list[list[int]], width: int) -> np.ndarray:
        """One model call's token vectors (len(rows), width, hidden), before pooling; a
        backend that cannot give them keeps this refusal."""
        raise InvalidValue(f"model {self.model_id!r} on backend {self.backend} does not give "
                           "per-token embeddings", param="model")

    def token_ids(self, texts: list[str], truncate: bool, side: str | None = None,
                  long_inputs: str | None = None) -> tuple[list[list[int]], np.ndarray]:
        """Ids with special tokens, truncated to max_seq_length at ``side`` (None: the
        model's ``truncation_side``), and billed token counts; ``long_inputs`` error (None:
        the model's setting) refuses an over-long text whatever ``truncate`` says."""
        side = side or self.truncation_side
        truncate = truncate and (long_inputs or self.long_inputs) != "error"
        if side is not None:
            full = self.tokens.ids(texts, None)
            lengths = np.fromiter((len(row) for row in full), dtype=np.int64, count=len(full))
            counts = check_lengths(lengths, self.max_seq_length, truncate)
            return [self._cut(row, side) for row in full], counts
        ids = self.tokens.ids(texts, self.max_seq_length)
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        if not truncate:
            at_limit = np.flatnonzero(lengths >= self.max_seq_length)
            if at_limit.size:
                full = self.tokens.ids([texts[i] for i in at_limit], None)
                lengths[at_limit] = [len(row) for row in full]
        return ids, check_lengths(lengths, self.max_seq_length, truncate)

    def _cut(self, row: list[int], side: str) -> list[int]:
        """``row`` (ids with specials) cut to max_seq_length at ``side``, its special
        tokens kept."""
        if len(row) <= self.max_seq_length:
            return row
        before, after = self._affix_lengths()
        room = self.max_seq_length - before - after
        content = row[before:len(row) - after]
        kept = content[len(content) - room:] if side == "left" else content[:room]
        return [*row[:before], *kept, *row[len(row) - after:]]

    def _affix_lengths(self) -> tuple[int, int]:
        """How many special tokens go before and after one sequence's own ids."""
        specials = set(self.tokens.with_specials([[]])[0])
        marker = next(t for t in range(len(specials) + 1) if t not in specials)
        probe = self.tokens.with_specials([[marker]])[0]
        before = probe.index(marker)
        return before, len(probe) - before - 1

    def chunks(self, texts: list[str], offsets: bool = False) -> Windows:
        """Each text's ids in windows of max_seq_length (specials included) that overlap
        by ``chunk_overlap`` tokens (a text within the limit is one window), and with
        ``offsets`` each window's [start, end) characters in its text."""
        before, after = self._affix_lengths()
        room = self.max_seq_length - before - after
        if self.chunk_overlap >= room:  # one window per token: the spec's to fix
            raise InvalidValue(f"model {self.model_id!r}: chunk_overlap {self.chunk_overlap} "
                               f"is not less than a window's {room} tokens", param="model")
        step = room - self.chunk_overlap
        windows: list[list[int]] = []
        spans: list[int] = []
        bounds: list[tuple[int, int]] = []
        rows, marks = (self.tokens.ids_offsets(texts) if offsets
                       else (self.tokens.ids(texts, None), None))
        for k, row in enumerate(rows):
            content = row[before:len(row) - after]
            starts = range(0, max(len(content) - room, 0) + step, step)
            spans.append(len(starts))
            windows += [[*row[:before], *content[s:s + room], *row[len(row) - after:]]
                        for s in starts]
            if marks is not None:
                own = marks[k][before:len(row) - after]
                bounds += [(own[s][0], own[min(s + room, len(own)) - 1][1]) if own else (0, 0)
                           for s in starts]
        lengths = np.array([len(w) for w in windows], dtype=np.int64)
        ends = np.concatenate([[0], np.cumsum(spans)]).astype(np.int64)
        counts = np.add.reduceat(lengths, ends[:-1]) if spans else lengths
        return Windows(windows, spans, counts,
                       np.array(bounds, dtype=np.int64).reshape(-1, 2) if offsets else None)

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        if self.long_inputs == "chunk":
            result = self.embed_many_sided([(texts, normalize, truncate, None)])[0]
            if isinstance(result, Exception):
                raise result
            return result
        ids, counts = self.token_ids(texts, truncate)
        return self._embed_ids(ids, counts, normalize)

    def embed_many(self, jobs: list[tuple[list[str], bool, bool]]) -> list[Encoded | Exception]:
        return self.embed_many_sided([(*job, None) for job in jobs])

    def embed_many_sided(self, jobs: list[tuple]) -> list[Encoded | Exception]:
        """Tokenize each request (a ``TextJob``, or its first fields as a tuple) alone, cut
        at its own side or chunked as its ``long_inputs`` says (None: the model's), then run
        all of them as one length-sorted batch. A chunked text's vector is the token-weighted
        mean of its windows' (before normalizing); with ``each``, its windows' own vectors
        and offsets come too, as ``outputs["chunks"]`` (``rows``: windows per text)."""
        results: list[Encoded | Exception] = []
        good: list[tuple[int, list[list[int]], np.ndarray, TextJob, Windows | None]] = []
        for k, job in enumerate(TextJob(*job) for job in jobs):
            windows = None
            try:
                if job.each or (job.long_inputs or self.long_inputs) == "chunk":
                    windows = self.chunks(job.texts, offsets=job.each)
                    ids, counts = windows.ids, windows.counts
                else:
                    ids, counts = self.token_ids(job.texts, job.truncate, job.side,
                                                 job.long_inputs)
            except Exception as exc:
                results.append(exc)
                continue
            results.append(exc_placeholder)
            good.append((k, ids, counts, job, windows))
        if good:
            merged = self._embed_ids([row for _, ids, _, _, _ in good for row in ids],
                               np.zeros(0, np.int64), normalize=False)
            start, rows = 0, max(len(merged.values), 1)
            for k, ids, counts, job, windows in good:
                values = merged.values[start:start + len(ids)]
                each = None
                if windows is not None:
                    lengths = np.array([len(row) for row in ids], dtype=np.int64)
                    if job.each:
                        each = {"chunks": Encoded(
                            l2_normalize(values) if job.normalize else values.copy(), lengths,
                            rows=np.array(windows.spans, np.int64), offsets=windows.offsets)}
                    values = chunk_mean(values, lengths.tolist(), windows.spans)
                # each request's part of the padded tokens, rounded so that the parts add
                # up to the whole (floors of each part alone summed to less: a batch's
                # real tokens over its padded ones came out above 1)
                share = (merged.padded_tokens * (start + len(ids)) // rows
                         - merged.padded_tokens * start // rows)
                start += len(ids)
                results[k] = Encoded(l2_normalize(values) if job.normalize else values, counts,
                                     share, outputs=each)
        return results

    def embed_all(self, texts: list[str], *, truncate: bool = True,
                  long_inputs: str | None = None) -> Encoded:
        """Each text's token vectors; never chunked (overlapping windows would give some
        tokens two vectors): ``long_inputs`` chunk truncates here."""
        ids, counts = self.token_ids(texts, truncate, long_inputs=long_inputs)
        lengths = [len(row) for row in ids]
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out: np.ndarray | None = None
        padded = 0
        for batch in self._calls(lengths, math.inf):
            width = max(lengths[i] for i in batch)
            padded += width * len(batch)
            hidden = self._forward_tokens([ids[i] for i in batch], width)
            if out is None:
                out = np.empty((int(starts[-1]), hidden.shape[2]), dtype=np.float32)
            for j, i in enumerate(batch):
                out[starts[i]:starts[i + 1]] = hidden[j, :lengths[i]]
        assert out is not None or not ids
        values = out if out is not None else np.empty((0, 0), dtype=np.float32)
        return Encoded(values, np.asarray(lengths, dtype=np.int64), padded)

    def late_pooling(self) -> str:
        """The model's own pooling as late chunking applies it to a chunk's tokens (mean,
        max, first, last); a refusal where the model does more after pooling than
        normalizing (a Dense layer: a chunk's mean would miss it)."""
        raise InvalidValue(f"model {self.model_id!r} on backend {self.backend} does not "
                           "give per-token embeddings for late chunking", param="model")

    def embed_late_chunks(self, documents: list[list[str]], *, normalize: bool,
                          pooling: str | None = None, truncate: bool = True) -> Encoded:
        """Each document's chunks tokenized alone (no specials) and joined, the document run
        once between the model's specials (in windows of max_seq_length that overlap by
        ``chunk_overlap`` when longer, whatever ``truncate`` says: each token's vector from
        the window it has the most context in), and each chunk's vector pooled from its own tokens'
        vectors. ``token_counts``
        per chunk: its tokens, its document's specials and overlaps billed to its first."""
        mode = pooling or self.late_pooling()
        if mode not in LATE_POOLING:
            raise InvalidValue(f"pooling must be one of {', '.join(LATE_POOLING)}",
                               param="pooling")
        before, after = self._affix_lengths()
        room = self.max_seq_length - before - after
        step = room - min(self.chunk_overlap, room // 2)
        flat = [chunk for doc in documents for chunk in doc]
        full = self.tokens.ids(flat, None) if flat else []
        affix = self.tokens.with_specials([[]])[0]
        head, tail = affix[:before], affix[before:]
        windows: list[list[int]] = []
        plans: list[tuple[int, list[int], list[tuple[int, int]]]] = []  # first window, starts, spans
        k = 0
        for d, doc in enumerate(documents):
            content: list[int] = []
            spans: list[tuple[int, int]] = []
            for j in range(len(doc)):
                row = full[k]
                k += 1
                own = row[before:len(row) - after]
                if not own:
                    raise InvalidValue(f"document {d}'s chunk {j} has no tokens: send chunks "
                                       "with text", param="input")
                spans.append((len(content), len(content) + len(own)))
                content += own
            starts = list(range(0, max(len(content) - room, 0) + step, step))
            plans.append((len(windows), starts, spans))
            windows += [[*head, *content[s:s + room], *tail] for s in starts]
        lengths = [len(w) for w in windows]
        hidden_of: list[np.ndarray] = [np.empty(0)] * len(windows)
        padded = 0
        for batch in self._calls(lengths, math.inf):
            width = max(lengths[i] for i in batch)
            padded += width * len(batch)
            out = self._forward_tokens([windows[i] for i in batch], width)
            for j, i in enumerate(batch):
                hidden_of[i] = out[j, before:lengths[i] - after]
        rows: list[np.ndarray] = []
        counts: list[int] = []
        for first, starts, spans in plans:
            tokens = _stitch([hidden_of[first + w] for w in range(len(starts))], starts)
            for a, b in spans:
                rows.append(_pool_span(tokens[a:b], mode))
                counts.append(b - a)
            counts[len(counts) - len(spans)] += (sum(lengths[first:first + len(starts)])
                                                 - spans[-1][1])
        dim = self._dimension
        values = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)
        if values.shape[1] != dim:
            raise InvalidValue(f"model {self.model_id!r} pools to {dim} dimensions from "
                               f"{values.shape[1]}-dimensional tokens (a layer after pooling)"
                               "; late chunking needs a model that pools its tokens alone",
                               param="model")
        return Encoded(l2_normalize(values) if normalize and len(values) else values,
                       np.asarray(counts, dtype=np.int64), padded,
                       rows=np.array([len(doc) for doc in documents], dtype=np.int64))

    def embed_tokens(self, ids: list[list[int]], *, normalize: bool,
                     truncate: bool = True) -> Encoded:
        vocab = self.tokens.vocab_size
        room = self.max_seq_length - self.tokens.specials
        for i, row in enumerate(ids):
            if any(t < 0 or t >= vocab for t in row):
                raise InvalidValue(f"input {i} has token ids outside 0..{vocab - 1}",
                                   param="input")
        lengths = np.array([len(row) + self.tokens.specials for row in ids], dtype=np.int64)
        counts = check_lengths(lengths, self.max_seq_length, truncate)
        full = self.tokens.with_specials([row[:room] for row in ids])
        return self._embed_ids(full, counts, normalize)

    def _embed_ids(self, ids: list[list[int]], counts: np.ndarray, normalize: bool) -> Encoded:
        out = np.empty((len(ids), self._dimension), dtype=np.float32)
        padded = 0
        # past SPLIT_MAX_TEXTS, larger products run cheaper per token than the calibration's
        # one-row calls show, so splitting by call cost is slower there and the token budget
        # alone decides (docs/benchmarks-history.md, "Round three")
        call_tokens = self.call_tokens if len(ids) <= SPLIT_MAX_TEXTS else math.inf
        for batch in self._calls([len(r) for r in ids], call_tokens):
            width = max(len(ids[i]) for i in batch)
            padded += width * len(batch)
            out[batch] = self._forward([ids[i] for i in batch], width)
        if normalize and len(ids):
            out = l2_normalize(out)
        return Encoded(out, counts, padded)

    def _calls(self, lengths: list[int], call_tokens: float) -> list[np.ndarray]:
        batches = length_batches(lengths, self.token_budget, call_tokens)
        if not self.rows_per_call:
            return batches
        step = self.rows_per_call
        return [b[i:i + step] for b in batches for i in range(0, len(b), step)]

    def calibrate(self) -> None:
        """Set ``call_tokens``: one row timed at a short and a long width (the best of
        ``CALIBRATION_REPEATS`` each) gives a call's fixed cost and a token's cost."""
        row = self.tokens.ids(["calibrate " * self.max_seq_length], self.max_seq_length)[0]
        short, long = CALIBRATION_WIDTHS[0], min(CALIBRATION_WIDTHS[1], len(row))
        if long - short < CALIBRATION_WIDTHS[0]:
            return  # a model this short has no room for padding to matter

        def best_of(width: int) -> float:
            rows = [row[:width - 1] + row[-1:]]
            times = []
            for _ in range(CALIBRATION_REPEATS):
                start = time.perf_counter()
                self._forward(rows, width)
                times.append(time.perf_counter() - start)
            return min(times)

        best_of(long)  # first calls at a new shape are slower (allocations, kernels)
        self.call_tokens = call_cost_tokens(best_of(short), best_of(long), short, long,
                                            self.token_budget)


exc_placeholder = RuntimeError("not computed")

LATE_POOLING = ("mean", "max", "first", "last")
"""How late chunking pools a chunk's token vectors."""
LATE_POOLING_OF = {"mean": "mean", "mean_sqrt_len_tokens": "mean", "weightedmean": "mean",
                   "max": "max", "cls": "first", "lasttoken": "last", "last_token": "last"}
"""A model's own pooling mode, as late chunking applies it to one chunk."""


def _stitch(parts: list[np.ndarray], starts: list[int]) -> np.ndarray:
    """One document's token vectors from its windows (``parts``, specials cut off) that
    start at ``starts``: where windows overlap, each token's from the window it sits
    deepest in (the most context on its shorter side; the earlier window on a tie)."""
    if len(parts) == 1:
        return parts[0]
    total = max(s + len(p) for s, p in zip(starts, parts, strict=True))
    out = np.empty((total, parts[0].shape[1]), dtype=np.float32)
    best = np.full(total, -1, dtype=np.int64)
    for start, part in zip(starts, parts, strict=True):
        at = np.arange(len(part))
        depth = np.minimum(at, len(part) - 1 - at)
        better = depth > best[start:start + len(part)]
        out[start:start + len(part)][better] = part[better]
        best[start:start + len(part)][better] = depth[better]
    return out


def _pool_span(tokens: np.ndarray, mode: str) -> np.ndarray:
    """One chunk's vector from its tokens' (as sentence-transformers' Pooling would)."""
    if mode == "mean":
        return tokens.mean(axis=0)
    if mode == "max":
        return tokens.max(axis=0)
    return tokens[0] if mode == "first" else tokens[-1]


class Windows(NamedTuple):
    """``BiEncoder.chunks``: the windows' ids (specials included), how many windows each
    text has, each text's billed tokens (every window's), and with offsets asked for each
    window's [start, end) characters in its text, shape (windows, 2)."""

    ids: list[list[int]]
    spans: list[int]
    counts: np.ndarray
    offsets: np.ndarray | None


def chunk_mean(values: np.ndarray, lengths: list[int], spans: list[int]) -> np.ndarray:
    """One row per text: the mean of its ``spans[i]`` consecutive chunk rows, each weighted
    by its ``lengths`` (tokens, specials included)."""
    weights = np.asarray(lengths, dtype=np.float32)[:, None]
    bounds = np.concatenate([[0], np.cumsum(spans)]).astype(np.int64)
    sums = np.add.reduceat(values * weights, bounds[:-1], axis=0)
    return (sums / np.add.reduceat(weights, bounds[:-1], axis=0)).astype(np.float32)
CALIBRATION_WIDTHS = (16, 128)  # tokens per row of the two timed calls
CALIBRATION_REPEATS = 5
MIN_CALL_TOKENS = 4.0  # a floor, so timing noise cannot split every distinct length
SPLIT_MAX_TEXTS = 16  # calls with more texts are split by the token budget alone


def call_cost_tokens(short_s: float, long_s: float, short: int, long: int,
                     token_budget: int) -> float:
    """A model call's fixed cost in tokens, from one row timed at two widths: the line
    through both points crosses zero tokens at the fixed cost. Infinite (only the budget
    splits) when the longer call was not slower, as on a GPU; at most the budget."""
    per_token = (long_s - short_s) / (long - short)
    if per_token <= 0:
        return math.inf
    fixed = short_s - per_token * short
    return min(max(fixed / per_token, MIN_CALL_TOKENS), float(token_budget))


def length_batches(lengths: list[int], token_budget: int,
                   call_tokens: float = math.inf) -> list[np.ndarray]:
    """Index groups of similar length: sorted by length, a group ends where its padded
    size (count x longest) would pass ``token_budget``, or where adding the next text
    would pad the group by more than ``call_tokens``, the cost of a call of its own."""
    if not lengths:
        return []
    order = np.argsort(np.asarray(lengths), kind="stable")
    batches, start = [], 0
    for end in range(1, len(order) + 1):
        if end < len(order):
            count, width, grown = end - start, lengths[order[end - 1]], lengths[order[end]]
            if grown * (count + 1) <= token_budget and count * (grown - width) <= call_tokens:
                continue
        batches.append(order[start:end])
        start = end
    return batches
