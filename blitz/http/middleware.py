"""The HTTP API's one middleware: request id, API keys, error replies, timing, metrics.

Pure ASGI around the router, so a request pays for one extra call and one wrapped ``send``:
it takes the request id and the API key from the headers, answers every error (a route's,
the router's 404 and 405, its own 401) in Blitz's JSON shape (or the peer API's the route
named, ``ERROR_SHAPE``), adds ``x-request-id``,
``x-compute-time``, ``x-blitz-pool`` and ``server-timing`` (``blitz.timing``: the time per
hop) to every reply (and ``x-blitz-priority`` to a request's that asked for one: the level
it ran at, ``take_priority``), and observes each request once; while traces are on, it gives
a request whose key passed its span (``blitz.runtime.tracing``: a refused key makes none).
Once the server stops (``drain``, a ``blitz.runtime.draining.Drain``), every new request is
a 503 with ``Retry-After``, and those in flight are counted until they end.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from starlette._utils import get_route_path  # the router's own reading of root_path
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blitz import timing
from blitz.errors import (
    BlitzError,
    ErrorShape,
    MethodNotAllowed,
    NotFound,
    as_blitz_error,
    echo,
)
from blitz.hop_messages import NORMAL, PRIORITIES, priority_level
from blitz.http import disconnect, internal
from blitz.http.responses import JSONBytesResponse
from blitz.ingress.keys import ApiKeys
from blitz.ingress.service import RequestRecord, record_failure
from blitz.runtime import tracing
from blitz.runtime.draining import Drain
from blitz.settings.config import AuthSettings

logger = logging.getLogger("blitz.http")
PUBLIC_ROUTES = frozenset({"/health", "/ready"})
PUBLIC_GETS = frozenset({"/", "/ping"})  # TEI's health checks; POST / is TEI's inference
RECORD = "blitz.record"  # scope key of the request's RequestRecord, for the routes
# scope key a route sets when its request speaks a peer's API: its errors take that API's
# shape (blitz.errors.ErrorShape); OpenAI's otherwise
ERROR_SHAPE = "blitz.error_shape"
REQUEST_ID = "blitz.request_id"  # scope key of the request's id (its x-request-id)
API_KEYS = "blitz.api_keys"  # scope key of the middleware's ApiKeys (take_priority's ceilings)
PRIORITY_ASKED = "blitz.priority_asked"  # scope key: the reply names the level it ran at
# (the request asked for one, or its key's ceiling is below normal)
PRIORITY_HEADER = "x-blitz-priority"  # high | normal | low; wins over the body's priority
_PRIORITY_KEY = PRIORITY_HEADER.encode()
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def record_of(scope: Scope) -> RequestRecord:
    """The request's record, made by the middleware; the service fills it in."""
    return scope[RECORD]


def take_priority(scope: Scope, payload: Any) -> None:
    """The request's priority into its record: the ``x-blitz-priority`` header's (its value
    in any case), else the body's ``priority``, else normal; either one not a priority name
    is a 422 naming it. What it asked for is held to its API key's ceiling
    (``auth.max_priority``, ``auth.priority_grants``; keys off: ``max_priority``), but for
    the header's with ``auth.trust_priority_header`` (a gateway sets it); the reply's
    ``x-blitz-priority`` says the level it ran at."""
    given = payload.get("priority") if isinstance(payload, dict) else None
    level = priority_level(given) if given is not None else None
    header = None
    for name, value in scope["headers"]:  # raw: no Headers object for the usual none
        if name.lower() == _PRIORITY_KEY:
            header = value.decode("latin-1")
            break  # the first, as starlette's Headers.get reads it
    if header is not None:
        level = priority_level(header.strip().lower(), param=PRIORITY_HEADER)
    record = record_of(scope)
    keys: ApiKeys | None = scope.get(API_KEYS)
    asked = NORMAL if level is None else level
    record.priority = (asked if keys is None else
                       keys.priority(asked, record.api_key, from_header=header is not None))
    if level is not None or record.priority != asked:
        scope[PRIORITY_ASKED] = True


def request_id_of(scope: Scope) -> str:
    """The id the middleware gave the request (also its ``x-request-id``)."""
    return scope[REQUEST_ID]


def speaks(scope: Scope, shape: ErrorShape) -> None:
    """The request speaks a peer's API: its errors take that API's shape."""
    scope[ERROR_SHAPE] = shape


class RequestMiddleware:
    """Wraps the router. ``paths`` are the routes' paths: a request to one of them is
    counted under its path (anything else under "other") and needs a key unless public."""

    def __init__(self, app: ASGIApp, paths: Collection[str], auth: AuthSettings,
                 observe: Callable[[RequestRecord, int], None], server_timing: bool = True):
        self.app = app
        self.server_timing = server_timing
        self.paths = frozenset(p for p in paths if "{" not in p)
        # paths with parameters (/v1/files/{file_id}): matched as templates, counted and
        # keyed under the template
        self.templates = [(compile_path(p)[0], p) for p in paths if "{" in p]
        self.observe = observe
        self.keys = ApiKeys(auth)
        self.drain = Drain()
        logger.info("API keys %s", f"on ({self.keys.count} key(s))" if self.keys.on else
                    "off: every route is public (set auth.api_keys, or auth.required: true "
                    "to refuse to start without keys)")
        self.paths |= {template for _, template in self.templates}
        self._keyed_paths = self.paths - PUBLIC_ROUTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the router's business
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = Headers(scope=scope)
        given = headers.get("x-request-id", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        path = self._template(get_route_path(scope))
        record = RequestRecord(path if path in self.paths else "other")
        scope[RECORD] = record
        scope[REQUEST_ID] = request_id
        scope[API_KEYS] = self.keys
        scope["app"] = self  # so the router raises its 404 and 405, answered below
        status = 0

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                total = time.perf_counter() - started
                extra = [(b"x-request-id", request_id.encode()),
                         (b"x-compute-time", f"{total:.6f}".encode())]
                if record.pool:
                    extra.append((b"x-blitz-pool", record.pool.encode()))
                if PRIORITY_ASKED in scope:  # the level it ran at: held to its key's ceiling
                    extra.append((PRIORITY_HEADER.encode(), PRIORITIES[record.priority].encode()))
                if self.server_timing:
                    looked_up = record.cache_hits + record.cache_misses
                    notes = ({"cache": f"hit {record.cache_hits} of {looked_up}"}
                             if looked_up else None)
                    extra.append((timing.HEADER.encode(),
                                  timing.header_value(record.timings, total, notes).encode()))
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        try:
            if self.drain.stopping:  # Drain.refuse_if_stopping, inline (the request path's)
                self.drain.refuse_if_stopping()  # 503 + Retry-After, not Serve's 404
            if internal.AS_KEY in scope:  # made in this process (a batch's line): its key
                record.api_key = scope[internal.AS_KEY]
            elif (self.keys.on and path in self._keyed_paths
                    and not (path in PUBLIC_GETS and scope["method"] in ("GET", "HEAD"))):
                record.api_key = self.keys.check(headers.get("authorization", ""))
            elif self.keys.on and path in PUBLIC_ROUTES and "authorization" in headers:
                try:  # public: no key is refused, but a valid one sees more (/ready's detail)
                    record.api_key = self.keys.check(headers["authorization"])
                except BlitzError:
                    pass
            if tracing.TRACER is not None:  # traces on (blitz.runtime.tracing): a span of
                # its own, once its key passed (a refused one is never traced)
                record.trace = self._span(scope, headers, path, request_id)
            self.drain.in_flight += 1  # Drain.held, inline: the request path's own
            try:
                if disconnect.UNWATCHED in scope["headers"]:  # disconnect.unwatched, inline
                    await disconnect.run_watching(self.app, scope, receive, send_with_headers)
                else:
                    await self.app(scope, receive, send_with_headers)
            finally:
                self.drain.in_flight -= 1
        except Exception as exc:  # the one place errors become replies
            if status:  # the reply has begun; nothing more can be said
                raise
            error, reply = self._error_reply(exc, scope, path, request_id)
            await reply(scope, receive, send_with_headers)
            record_failure(record, error, self.observe)  # as sent: error.status
            return
        else:
            self.observe(record, status)
        finally:
            if record.trace is not None:  # no status: the client left, or the reply broke
                record.trace.end(record, not 0 < status < 500,
                                 {"http.response.status_code": status})

    def _template(self, path: str) -> str:
        """``path``, or the route template it matches (``/v1/files/{file_id}``)."""
        if path in self.paths or not self.templates:
            return path
        for pattern, template in self.templates:
            if pattern.match(path):
                return template
        return path

    def _span(self, scope: Scope, headers: Headers, path: str,
              request_id: str) -> tracing.RequestSpan | None:
        """The request's span: ``POST /embed``, a child of the client's ``traceparent``."""
        method = scope["method"]
        routed = path in self.paths
        return tracing.start_request(
            f"{method} {path}" if routed else method, headers,
            {"http.request.method": method, "url.path": path[:256],  # a stranger's: capped
             "blitz.request_id": request_id,
             **({"http.route": path} if routed else {})})

    @staticmethod
    def _error_reply(exc: Exception, scope: Scope, path: str,
                     request_id: str) -> tuple[BlitzError, JSONBytesResponse]:
        headers: dict[str, str] = {}
        error: BlitzError
        if isinstance(exc, HTTPException):  # the router's: no such path, or not this method
            if exc.status_code == 405 and exc.headers:
                headers["allow"] = exc.headers["Allow"]
                error = MethodNotAllowed(f"{echo(path)} takes {headers['allow']}, not "
                                         f"{echo(scope['method'])}")
            else:
                error = NotFound(f"no route {echo(scope['method'])} {echo(path)}")
        else:
            error = as_blitz_error(exc)
        if not error.expose:
            logger.error("request %s failed", request_id, exc_info=exc)
        if error.retry_after_s is not None:
            headers["retry-after"] = str(error.retry_after_s)
        if error.close_connection:
            headers["connection"] = "close"
        return error, JSONBytesResponse(error.to_shape(scope.get(ERROR_SHAPE, "openai"),
                                                       request_id),
                                        status_code=error.status, headers=headers)


def warn_if_open(host: str | None, auth: AuthSettings) -> bool:
    """Log a WARNING when the server listens beyond loopback (``host``, Serve's
    ``http_options.host``) with API keys off: anyone who reaches the port can embed, load
    any configured model and read every route. True when it warned."""
    if auth.resolved_keys() or host is None or is_loopback(host):
        return False
    logger.warning("listening on %s with API keys off: anyone who reaches this port can use "
                   "every route. Set auth.api_keys or $%s (and auth.required: true), or "
                   "listen on 127.0.0.1", host, auth.api_keys_env)
    return True


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name, brackets allowed) is this machine only."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"
