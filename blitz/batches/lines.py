"""A batch's input lines, and the lines its output and error files hold.

Each input line is one request, as OpenAI's batch API takes it::

    {"custom_id": "doc-1", "method": "POST", "url": "/v1/embeddings", "body": {...}}

``check_line`` says what is wrong with a line (its error in the error file: a bad line
never fails the batch); ``plan`` reads the whole input once when the batch starts (linear
in its size: a line over the limit is skipped without being held), writes the bad lines'
errors, finds the pieces (``chunk_lines`` good lines each, by byte offset, so each piece
is read on its own) and refuses a batch whose ``custom_id`` repeats (each must be once
in the output). ``piece_lines`` reads one piece's good lines again.

An output line is OpenAI's ``{id, custom_id, response: {status_code, request_id, body},
error}``; the reply's JSON body is written into it as it came, never decoded.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

READ = 1 << 20
MAX_CUSTOM_ID = 512
MAX_PROBLEMS = 20  # a failed batch's errors list names at most this many lines
PIECE_BYTES = 64 * 1024  # a piece also ends past this many bytes of input: its replies,
# held together on their way to the store, stay a bounded multiple of it


def lines_at(f: Any, max_bytes: int, offset: int = 0) -> Iterator[tuple[int, bytes | None]]:
    """(the byte offset it starts at, the line without its end) for each line of the open
    binary file ``f`` from ``offset``; the line is None when it is longer than
    ``max_bytes`` (its bytes are skipped, never joined)."""
    f.seek(offset)
    start, held, skipping = offset, 0, False
    parts: list[bytes] = []
    position = offset
    while data := f.read(READ):
        at = 0
        while (end := data.find(b"\n", at)) >= 0:
            piece = data[at:end]
            if skipping or held + len(piece) > max_bytes:
                yield start, None
            else:
                yield start, b"".join([*parts, piece]).removesuffix(b"\r")
            position += end - at + 1
            parts, held, skipping, start, at = [], 0, False, position, end + 1
        rest = len(data) - at
        position += rest
        if not skipping:
            held += rest
            parts.append(data[at:])
            if held > max_bytes:
                parts, held, skipping = [], 0, True
    if skipping or held:
        yield start, None if skipping else b"".join(parts).removesuffix(b"\r")


@dataclass
class Line:
    custom_id: str | None
    body: bytes | None  # the request's body as JSON (None: the line is bad)
    code: str = ""  # why it is bad (OpenAI's error codes)
    message: str = ""


def check_line(raw: bytes | None, endpoint: str, max_bytes: int) -> Line:
    """One input line: its custom_id and body, or why it cannot be sent."""
    if raw is None:
        return Line(None, None, "line_too_long", f"the line is over {max_bytes} bytes "
                    "(limits.max_body_bytes)")
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):
        return Line(None, None, "invalid_json_line", "the line is not JSON")
    if not isinstance(row, dict):
        return Line(None, None, "invalid_json_line", "the line is not a JSON object")
    custom_id = row.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return Line(None, None, "invalid_custom_id", "custom_id must be a string of 1 to "
                    f"{MAX_CUSTOM_ID} characters")
    if row.get("method", "POST") != "POST":
        return Line(custom_id, None, "invalid_method", "method must be POST")
    if row.get("url") != endpoint:
        return Line(custom_id, None, "mismatched_url", f"url must be the batch's endpoint "
                    f"{endpoint} (this line's: {str(row.get('url'))[:100]})")
    body = row.get("body")
    if not isinstance(body, dict):
        return Line(custom_id, None, "invalid_body", "body must be a JSON object")
    return Line(custom_id, json.dumps(body, ensure_ascii=False).encode())


@dataclass
class Plan:
    total: int = 0  # non-blank lines
    bad: int = 0  # of them, lines that cannot be sent (their errors written)
    pieces: list[dict[str, int]] = field(default_factory=list)  # {index, offset, lines}
    problems: list[dict[str, Any]] = field(default_factory=list)  # what fails the batch


def plan(f: Any, endpoint: str, max_bytes: int, chunk_lines: int, max_lines: int,
         bad_out: Any) -> Plan:
    """Read the input ``f`` once: its pieces, its bad lines' errors into ``bad_out`` (a
    binary writer), and what fails the whole batch (too many lines, a custom_id used
    twice, no line at all)."""
    found = Plan()
    seen: set[str] = set()
    in_piece = 0
    for number, (offset, raw) in enumerate(lines_at(f, max_bytes), 1):
        if raw is not None and not raw.strip():
            continue
        found.total += 1
        if found.total > max_lines:
            found.problems.append(_problem("too_many_requests", f"the file has more than "
                                           f"{max_lines} requests (batches."
                                           "max_requests_per_batch)", number))
            return found
        line = check_line(raw, endpoint, max_bytes)
        if line.custom_id is not None:
            if line.custom_id in seen:
                if len(found.problems) < MAX_PROBLEMS:
                    found.problems.append(_problem(
                        "duplicate_custom_id", f"custom_id {line.custom_id[:100]!r} is used "
                        "more than once: each request's must be unique", number))
                continue
            seen.add(line.custom_id)
        if line.body is None:
            found.bad += 1
            bad_out.write(error_line(line.custom_id, line.code,
                                     f"line {number}: {line.message}"))
            continue
        if in_piece == 0 or offset - found.pieces[-1]["offset"] > PIECE_BYTES:
            found.pieces.append({"index": len(found.pieces), "offset": offset, "lines": 0})
            in_piece = 0
        found.pieces[-1]["lines"] += 1
        in_piece = (in_piece + 1) % chunk_lines
    if found.total == 0:
        found.problems.append(_problem("empty_file", "the input file has no requests", None))
    return found


def piece_lines(f: Any, piece: dict[str, int], endpoint: str,
                max_bytes: int) -> list[tuple[str, bytes]]:
    """(custom_id, body) of each of ``piece``'s good lines, read from its offset."""
    found: list[tuple[str, bytes]] = []
    for _, raw in lines_at(f, max_bytes, piece["offset"]):
        if raw is not None and not raw.strip():
            continue
        line = check_line(raw, endpoint, max_bytes)
        if line.body is None or line.custom_id is None:
            continue  # a bad line: its error was written when the batch started
        found.append((line.custom_id, line.body))
        if len(found) == piece["lines"]:
            break
    return found


def _problem(code: str, message: str, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def request_line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def output_line(custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    """A request's answer; ``body`` is its reply's JSON as it came (``null`` if empty)."""
    return b"".join((b'{"id":"', request_line_id().encode(), b'","custom_id":',
                     json.dumps(custom_id).encode(), b',"response":{"status_code":',
                     str(status).encode(), b',"request_id":', json.dumps(request_id).encode(),
                     b',"body":', _json_body(body), b'},"error":null}\n'))


def _json_body(body: bytes) -> bytes:
    """A reply's body as JSON in the line: as it came when it is an object or a list (what
    every route answers, JSON asked for), else as a string."""
    body = body.strip()
    if body[:1] in (b"{", b"["):
        return body
    return json.dumps(body.decode("utf-8", "replace")).encode()


def error_line(custom_id: str | None, code: str, message: str) -> bytes:
    """A request that was never answered: OpenAI's ``error: {code, message}``."""
    return (json.dumps({"id": request_line_id(), "custom_id": custom_id, "response": None,
                        "error": {"code": code, "message": message}}) + "\n").encode()
