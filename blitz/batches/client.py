"""The ``blitz batch`` command: a client of a server's Files and Batches API (OpenAI's).

    blitz batch submit INPUT [--endpoint E] [--metadata KEY=VALUE ...] [--wait]
                       [--output OUT.jsonl] [--errors ERR.jsonl] [--poll-s 2] [--json]
                       [--from-corpus [--model M] [--text-column text] [--id-column id]
                                      [--texts-per-line 1]]
    blitz batch status ID | list [--limit 20] [--after ID] | cancel ID
    blitz batch results ID --output OUT.jsonl [--errors ERR.jsonl]
    (each with --url URL, default $BLITZ_URL or http://127.0.0.1:8000, and --api-key KEY,
    default $BLITZ_API_KEY)

``submit`` uploads a JSONL file of request lines (``purpose=batch``) and creates a batch
on it; ``--from-corpus`` first turns a corpus of ``{id, text}`` rows (``corpus_lines``)
into request lines in a temporary file. ``--wait`` polls until the batch ends and
downloads its output. Files are streamed both ways, never held in memory, so a batch
of millions of lines costs the client nothing but disk.

Only httpx here (no server code, no Ray): ``blitz/cli.py`` registers the command with
``add_batch_command``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_ENDPOINT = "/v1/embeddings"
TERMINAL = ("completed", "failed", "expired", "cancelled")
TIMEOUT = httpx.Timeout(60.0)  # connect, read, write and pool, each call
UPLOAD_TIMEOUT = httpx.Timeout(60.0, write=600.0, read=600.0)  # a large file, then its check
CHUNK = 1 << 20  # download chunk (bytes)
POLL_RETRIES = 5  # consecutive transient failures --wait rides out before giving up
CORPUS_INPUT_KEY = {"/v1/embeddings": "input", "/embed": "inputs"}  # --from-corpus endpoints
EXIT_CODES = """exit status: 0 done (submit without --wait: created), every request answered;
3 completed, but some requests failed (see the errors file); 1 the batch failed, expired or
was cancelled, or an HTTP error; 2 usage"""


class BatchError(Exception):
    """A call that failed: the message says which and why (exit status 1). ``transient``:
    the server could not be reached, timed out or answered 5xx, so a poll may retry."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class BatchUsageError(Exception):
    """A bad command line or input file, found before anything was sent (exit status 2)."""


# --- the HTTP client ----------------------------------------------------------------------

class BatchClient:
    """OpenAI's Files and Batches API on one server; every call has a timeout and turns any
    failure into a ``BatchError`` carrying the server's own error message."""

    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, *,
                 transport: httpx.BaseTransport | None = None,
                 timeout: httpx.Timeout = TIMEOUT):
        self.base_url = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BatchClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def upload_file(self, path: Path, filename: str | None = None,
                    purpose: str = "batch") -> dict[str, Any]:
        """Upload ``path`` (streamed from disk, multipart) and return the file object."""
        with open(path, "rb") as f:
            return self._call("POST", "/v1/files", timeout=UPLOAD_TIMEOUT,
                              data={"purpose": purpose},
                              files={"file": (filename or path.name, f, "application/jsonl")})

    def delete_file(self, file_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/files/{quote(file_id, safe='')}")

    def create_batch(self, input_file_id: str, endpoint: str,
                     metadata: dict[str, str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"input_file_id": input_file_id, "endpoint": endpoint,
                                "completion_window": "24h"}
        if metadata:
            body["metadata"] = metadata
        return self._call("POST", "/v1/batches", json=body)

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/batches/{quote(batch_id, safe='')}")

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/batches/{quote(batch_id, safe='')}/cancel")

    def download(self, file_id: str, path: Path) -> int:
        """Stream a file's content to ``path`` (through ``path.part``, renamed when whole, so
        a broken download never looks finished); the number of bytes written."""
        url = f"/v1/files/{quote(file_id, safe='')}/content"
        part = path.with_name(path.name + ".part")
        written = 0
        try:
            with self._failures("GET", url), self._http.stream("GET", url) as reply:
                if reply.is_error:
                    reply.read()
                    raise _http_error("GET", self.base_url + url, reply)
                with open(part, "wb") as f:
                    for chunk in reply.iter_bytes(CHUNK):
                        f.write(chunk)
                        written += len(chunk)
            part.replace(path)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        return written

    def list(self, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        """One page of batches, newest first: ``{data, first_id, last_id, has_more}``."""
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return self._call("GET", "/v1/batches", params=params)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with self._failures(method, path):
            reply = self._http.request(method, path, **kwargs)
        if reply.is_error:
            raise _http_error(method, str(reply.request.url), reply)
        try:
            body = reply.json()
        except ValueError:
            raise BatchError(f"{method} {reply.request.url}: the answer is not JSON: "
                             f"{reply.text[:200]!r}") from None
        if not isinstance(body, dict):
            raise BatchError(f"{method} {reply.request.url}: expected a JSON object, got "
                             f"{reply.text[:200]!r}")
        return body

    @contextmanager
    def _failures(self, method: str, path: str) -> Iterator[None]:
        """httpx's exceptions as ``BatchError``: a refused connection names the server."""
        url = self.base_url + path
        try:
            yield
        except httpx.ConnectError as exc:
            raise BatchError(f"cannot reach the server at {self.base_url} ({exc}); is it "
                             "running? (--url or $BLITZ_URL)", transient=True) from None
        except httpx.TimeoutException as exc:
            raise BatchError(f"{method} {url}: timed out ({type(exc).__name__})",
                             transient=True) from None
        except httpx.HTTPError as exc:
            raise BatchError(f"{method} {url}: {exc}", transient=True) from None


def _http_error(method: str, url: str, reply: httpx.Response) -> BatchError:
    """The server's error (OpenAI's ``{"error": {message, type, param, code}}``, or any
    body) as one line: status, message, then type, code and param when given."""
    try:
        body = reply.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    details = []
    if isinstance(error, dict) and error.get("message"):
        message = str(error["message"])
        details = [f"{key} {error[key]}" for key in ("type", "code", "param") if error.get(key)]
    elif isinstance(error, str):
        message = error
    else:
        message = reply.text.strip()[:500] or reply.reason_phrase
    extra = f" ({', '.join(details)})" if details else ""
    return BatchError(f"{method} {url}: {reply.status_code} {message}{extra}",
                      transient=reply.status_code >= 500)


# --- --from-corpus: rows to request lines -------------------------------------------------

def corpus_lines(src: Path, dst: Path, *, endpoint: str = DEFAULT_ENDPOINT,
                 model: str | None = None, text_column: str = "text", id_column: str = "id",
                 texts_per_line: int = 1) -> tuple[int, int]:
    """Write request lines for the corpus ``src`` (JSONL rows ``{id, text}``, as ``blitz
    embed`` reads) to ``dst``, streaming; the number of rows and of lines.

    With ``texts_per_line`` 1 each row is one request: ``custom_id`` is the row's id and
    ``input`` its text. With N > 1, N consecutive rows make one request whose ``input`` is
    their texts as a list (the answer's ``data[i]`` is row i of the group) and whose
    ``custom_id`` is ``"<first id>..<last id>"``. A row without an id gets its position
    (from 0), as in ``blitz embed``; numbers become strings. A row whose text is missing,
    not a string or blank is refused with its line number (``BatchUsageError``), and so is a
    line that is not a JSON object: a batch that silently left rows out would be a corpus
    with holes, so fix or drop such rows first. Blank lines are skipped.
    """
    if texts_per_line < 1:
        raise BatchUsageError("--texts-per-line must be at least 1")
    input_key = CORPUS_INPUT_KEY.get(endpoint)
    if input_key is None:
        raise BatchUsageError(f"--from-corpus makes embedding requests: --endpoint must be one "
                              f"of {', '.join(CORPUS_INPUT_KEY)}, not {endpoint}")
    rows = lines = 0
    ids: list[str] = []
    texts: list[str] = []

    def flush(out: TextIO) -> None:
        nonlocal lines
        custom_id = ids[0] if texts_per_line == 1 else f"{ids[0]}..{ids[-1]}"
        body: dict[str, Any] = {"model": model} if model else {}
        body[input_key] = texts[0] if texts_per_line == 1 else list(texts)
        out.write(json.dumps({"custom_id": custom_id, "method": "POST", "url": endpoint,
                              "body": body}, ensure_ascii=False) + "\n")
        lines += 1
        ids.clear()
        texts.clear()

    with open(src, "rb") as f, open(dst, "w", encoding="utf-8") as out:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{src} line {number}"
            try:
                row = json.loads(raw)
            except ValueError as exc:
                raise BatchUsageError(f"{where}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise BatchUsageError(f"{where}: not a JSON object")
            text = row.get(text_column)
            if not isinstance(text, str) or not text.strip():
                raise BatchUsageError(
                    f"{where}: no text in column {text_column!r} (every row needs a non-blank "
                    "string; fix or drop the row, or pick the column with --text-column)")
            ident = row.get(id_column)
            if isinstance(ident, (dict, list)):
                raise BatchUsageError(f"{where}: the id in column {id_column!r} is not a "
                                      "string or number")
            ids.append(str(rows) if ident is None else str(ident))
            texts.append(text)
            rows += 1
            if len(texts) == texts_per_line:
                flush(out)
        if texts:
            flush(out)
    if not rows:
        raise BatchUsageError(f"{src} holds no rows")
    return rows, lines


def first_endpoint(path: Path) -> str | None:
    """The ``url`` of the first request line in ``path``, if it has one (the default
    ``--endpoint``: a batch serves one endpoint, which its lines name)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    return None
                return url if isinstance(url, str) else None
    return None


# --- the command --------------------------------------------------------------------------

def add_batch_command(commands: Any, transport: httpx.BaseTransport | None = None) -> None:
    """Add ``batch`` to the ``blitz`` command's subcommands (``transport``: tests' httpx
    transport instead of the network)."""
    batch = commands.add_parser(
        "batch", help="batch jobs on a running server (OpenAI's Files and Batches API): "
        "submit a JSONL file or a corpus, wait, download the results", epilog=EXIT_CODES)
    actions = batch.add_subparsers(dest="batch_action", required=True, metavar="ACTION")

    def server(action: argparse.ArgumentParser, run: Callable[..., int]) -> None:
        action.add_argument("--url", default=os.environ.get("BLITZ_URL", DEFAULT_URL), metavar="URL",
                            help=f"the server (default: $BLITZ_URL or {DEFAULT_URL})")
        action.add_argument("--api-key", default=os.environ.get("BLITZ_API_KEY"), metavar="KEY",
                            help="a bearer API key (default: $BLITZ_API_KEY)")
        action.add_argument("--json", action="store_true", help="print the batch as JSON")
        action.set_defaults(run=_command(run), transport=transport, poll_sleep=time.sleep)

    submit = actions.add_parser(
        "submit", help="upload INPUT and create a batch on it", epilog=EXIT_CODES,
        description="Upload INPUT (JSONL request lines {custom_id, method, url, body}, or "
        "with --from-corpus rows {id, text}) and create a batch; prints its id.")
    submit.add_argument("input", type=Path, metavar="INPUT", help="request lines, or with --from-corpus a "
                        "JSONL corpus")
    submit.add_argument("--endpoint", help="the batch's endpoint (default: the url of INPUT's "
                        f"first line; with --from-corpus {DEFAULT_ENDPOINT}, or /embed)")
    submit.add_argument("--metadata", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE", help="the batch's metadata (strings)")
    submit.add_argument("--wait", action="store_true", help="poll until the batch ends "
                        "(progress on stderr), then download its output")
    submit.add_argument("--output", type=Path, metavar="OUT.jsonl",
                        help="where --wait writes the output file (implies --wait)")
    submit.add_argument("--errors", type=Path, metavar="ERR.jsonl",
                        help="where --wait writes the error file, when there is one "
                        "(implies --wait)")
    submit.add_argument("--poll-s", type=float, default=2.0, metavar="S", help="seconds between polls "
                        "(default: 2)")
    corpus = submit.add_argument_group("--from-corpus")
    corpus.add_argument("--from-corpus", action="store_true", help="INPUT is a corpus "
                        "(JSONL rows {id, text}): one embedding request per row, or per "
                        "--texts-per-line rows (custom_id \"<first id>..<last id>\"); a row "
                        "without text is refused (exit 2) with its line number")
    corpus.add_argument("--model", metavar="M", help="the model the requests name (default: the server's)")
    corpus.add_argument("--text-column", default="text", metavar="COLUMN", help="default: text")
    corpus.add_argument("--id-column", default="id", metavar="COLUMN", help="default: id (absent: the row's "
                        "position)")
    corpus.add_argument("--texts-per-line", type=int, default=1, metavar="N",
                        help="texts per request (default: 1)")
    server(submit, run_submit)

    for name, run, what in (("status", run_status, "show a batch"),
                            ("cancel", run_cancel, "cancel a batch")):
        action = actions.add_parser(name, help=what)
        action.add_argument("batch_id", metavar="ID")
        server(action, run)
    listing = actions.add_parser("list", help="list batches, newest first")
    listing.add_argument("--limit", type=int, default=20, help="at most N (default: 20)")
    listing.add_argument("--after", metavar="ID", help="the page after this batch")
    server(listing, run_list)
    results = actions.add_parser("results", help="download a finished batch's output",
                                 epilog=EXIT_CODES)
    results.add_argument("batch_id", metavar="ID")
    results.add_argument("--output", type=Path, required=True, metavar="OUT.jsonl")
    results.add_argument("--errors", type=Path, metavar="ERR.jsonl")
    server(results, run_results)


def _command(action: Callable[..., int]) -> Callable[[argparse.Namespace, TextIO], int]:
    """``action(client, args, out)`` as the ``run(args, out)`` that ``blitz.cli`` calls, with
    this command's failures printed and mapped to exit statuses."""
    def run(args: argparse.Namespace, out: TextIO) -> int:
        try:
            with BatchClient(args.url, args.api_key, transport=args.transport) as client:
                return action(client, args, out)
        except BatchUsageError as exc:
            print(f"blitz: error: {exc}", file=sys.stderr)
            return 2
        except BatchError as exc:
            print(f"blitz: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"blitz: {exc}", file=sys.stderr)
            return 1
    return run


def run_submit(client: BatchClient, args: argparse.Namespace, out: TextIO) -> int:
    metadata = parse_metadata(args.metadata)
    wait = args.wait or args.output is not None or args.errors is not None
    for path in (args.output, args.errors):
        if path is not None and not path.resolve().parent.is_dir():
            raise BatchUsageError(f"{path}: no such directory")
    if not args.input.is_file():
        raise BatchUsageError(f"{args.input}: no such file")
    if args.poll_s < 0:
        raise BatchUsageError("--poll-s must not be negative")
    if args.from_corpus:
        endpoint = args.endpoint or DEFAULT_ENDPOINT
        with tempfile.TemporaryDirectory(prefix="blitz-batch-") as tmp:
            requests = Path(tmp) / f"{args.input.stem}.requests.jsonl"
            rows, lines = corpus_lines(
                args.input, requests, endpoint=endpoint, model=args.model,
                text_column=args.text_column, id_column=args.id_column,
                texts_per_line=args.texts_per_line)
            print(f"{rows} rows as {lines} request lines", file=sys.stderr)
            uploaded = client.upload_file(requests)
    else:
        if args.model:
            raise BatchUsageError("--model applies to --from-corpus (request lines name "
                                  "their own model)")
        endpoint = args.endpoint or first_endpoint(args.input) or DEFAULT_ENDPOINT
        uploaded = client.upload_file(args.input)
    try:
        batch = client.create_batch(uploaded["id"], endpoint, metadata)
    except BatchError:
        try:  # best effort: no orphan upload left behind
            client.delete_file(uploaded["id"])
        except BatchError:
            pass
        raise
    if not wait:
        out.write(_json(batch) if args.json else batch["id"] + "\n")
        return 0
    if not args.json:
        out.write(batch["id"] + "\n")
        out.flush()
    batch = wait_for(client, batch, args.poll_s, sleep=args.poll_sleep)
    if args.json:
        out.write(_json(batch))
    return fetch_results(client, batch, args.output, args.errors)


def run_status(client: BatchClient, args: argparse.Namespace, out: TextIO) -> int:
    batch = client.retrieve(args.batch_id)
    out.write(_json(batch) if args.json else describe(batch) + "\n")
    return 0


def run_cancel(client: BatchClient, args: argparse.Namespace, out: TextIO) -> int:
    batch = client.cancel(args.batch_id)
    out.write(_json(batch) if args.json else describe(batch) + "\n")
    return 0


def run_list(client: BatchClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.limit < 1:
        raise BatchUsageError("--limit must be at least 1")
    page = client.list(args.limit, args.after)
    if args.json:
        out.write(_json(page))
        return 0
    for batch in page.get("data") or []:
        out.write(describe(batch) + "\n")
    if page.get("has_more"):
        print(f"(more: --after {page.get('last_id')})", file=sys.stderr)
    return 0


def run_results(client: BatchClient, args: argparse.Namespace, out: TextIO) -> int:
    batch = client.retrieve(args.batch_id)
    if batch.get("status") not in TERMINAL:
        raise BatchError(f"batch {args.batch_id} is {batch.get('status')}: no results yet "
                         "(blitz batch status ID; submit --wait waits)")
    if args.json:
        out.write(_json(batch))
    return fetch_results(client, batch, args.output, args.errors)


def wait_for(client: BatchClient, batch: dict[str, Any], poll_s: float,
             sleep: Callable[[float], object] = time.sleep,
             progress: TextIO | None = None) -> dict[str, Any]:
    """Poll ``batch`` every ``poll_s`` seconds until it ends; each change of its status or
    counts is a line on ``progress`` (stderr). A few transient failures in a row (the
    server restarting) are waited out; Ctrl-C stops waiting, not the batch."""
    progress = progress or sys.stderr
    shown, misses = "", 0
    try:
        while True:
            line = describe(batch)
            if line != shown:
                print(line, file=progress, flush=True)
                shown = line
            if batch.get("status") in TERMINAL:
                return batch
            sleep(poll_s)
            try:
                batch = client.retrieve(batch["id"])
                misses = 0
            except BatchError as exc:
                misses += 1
                if not exc.transient or misses > POLL_RETRIES:
                    raise
                print(f"blitz: {exc} (retrying)", file=progress)
    except KeyboardInterrupt:
        print(f"stopped waiting; batch {batch['id']} goes on (blitz batch status "
              f"{batch['id']}; blitz batch cancel {batch['id']})", file=progress)
        raise


def fetch_results(client: BatchClient, batch: dict[str, Any], output: Path | None,
                  errors: Path | None) -> int:
    """Download a finished batch's output and error files where asked; its exit status."""
    for path, key, what in ((output, "output_file_id", "output"),
                            (errors, "error_file_id", "errors")):
        if path is None:
            continue
        file_id = batch.get(key)
        if not file_id:
            print(f"batch {batch['id']} has no {what} file", file=sys.stderr)
            continue
        size = client.download(file_id, path)
        print(f"{what}: {path} ({size} bytes)", file=sys.stderr)
    return outcome(batch)


def outcome(batch: dict[str, Any]) -> int:
    """0 completed with every request answered, 3 completed with failed requests, 1 any
    other end (its errors printed)."""
    if batch.get("status") == "completed":
        return 3 if (batch.get("request_counts") or {}).get("failed") else 0
    errors = (batch.get("errors") or {}).get("data") or []
    for error in errors[:20]:
        line = f"line {error['line']}: " if error.get("line") is not None else ""
        print(f"batch {batch.get('id')}: {line}{error.get('message') or error.get('code')}",
              file=sys.stderr)
    return 1


def describe(batch: dict[str, Any]) -> str:
    """One line: id, status, endpoint, request counts, and the output and error files."""
    counts = batch.get("request_counts") or {}
    files = "".join(f", {what} {batch[key]}" for key, what in (
        ("output_file_id", "output"), ("error_file_id", "errors")) if batch.get(key))
    return (f"{batch.get('id')}: {batch.get('status')} {batch.get('endpoint') or ''}, "
            f"{counts.get('completed', 0)}/{counts.get('total', 0)} done, "
            f"{counts.get('failed', 0)} failed{files}")


def parse_metadata(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict (the later of two equal keys wins)."""
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BatchUsageError(f"--metadata {pair!r}: expected KEY=VALUE")
        metadata[key] = value
    return metadata


def _json(value: Any) -> str:
    return json.dumps(value, indent=2) + "\n"
