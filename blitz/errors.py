"""One error hierarchy, one status table.

Errors are grouped by who caused them, which is not the same as whether their text may
be shown (``expose``, stated on every class): a ``ClientError`` is the request's fault
(4xx) and says what to change; a ``RetryLater`` is the service's state (503 with
``Retry-After``), told in words written for the client; a ``ModelLoadFailed`` and an
``InternalError`` carry server-side detail (paths, exception text) that stays in the log.

    BlitzError                      500 internal_error                    expose=False
     ├── ClientError                (the request's fault)                 expose=True
     │    ├── BadRequest            400 invalid_request_error / bad_request
     │    ├── Unauthorized          401 authentication_error / invalid_api_key
     │    ├── NotFound              404 not_found_error / not_found
     │    │    └── UnknownModel     404 not_found_error / model_not_found
     │    ├── MethodNotAllowed      405 invalid_request_error / method_not_allowed (+ Allow)
     │    ├── RequestTimeout        408 invalid_request_error / request_timeout (+ close)
     │    ├── PayloadTooLarge       413 invalid_request_error / payload_too_large
     │    │    └── InputTooLong     413 invalid_request_error / input_too_long
     │    └── InvalidValue          422 invalid_request_error / invalid_value
     ├── RetryLater                 (the service's state, + Retry-After)  expose=True
     │    ├── Overloaded            503 overloaded_error / overloaded     Retry-After: 1
     │    ├── Unavailable           503 unavailable_error / unavailable   Retry-After: 2
     │    │    └── TimedOut         503 unavailable_error / timeout       Retry-After: 2
     │    └── NotReady              503 unavailable_error / not_ready     Retry-After: 5
     ├── ModelLoadFailed            424 model_load_error / model_load_failed (fixed text)
     ├── ModelTooLarge              507 model_load_error / model_too_large    expose=True
     └── InternalError              500 internal_error (the request id only)

Every error renders as OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``,
except where a request speaks a peer's API (``ErrorShape``): Hugging Face TEI's
``{"error", "error_type"}`` (``tei_type``: validation, overloaded, unhealthy, backend;
then Blitz's ``param`` and ``code``),
Cohere's ``{"id", "message"}`` and Voyage's ``{"detail"}`` (then Blitz's ``param`` and
``code``). Errors cross Ray process boundaries, so each one pickles
with its fields intact.
"""

from __future__ import annotations

from typing import Any, Literal

ErrorShape = Literal["openai", "tei", "cohere", "voyage"]


class BlitzError(Exception):
    """Base of every error Blitz answers with; unknown exceptions become ``InternalError``."""

    status: int = 500
    type: str = "internal_error"
    code: str = "internal_error"
    expose: bool = False  # whether ``message`` may be sent to the client
    retry_after_s: int | None = None  # sent as ``Retry-After`` when set (RetryLater only)
    close_connection: bool = False  # reply with ``connection: close``
    tei_type: str = "backend"  # Hugging Face TEI's ``error_type`` for this error

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.param))

    def public_message(self) -> str:
        """What the client may read; internal text never leaves the server."""
        return self.message if self.expose else "internal server error"

    def to_payload(self, request_id: str | None = None) -> dict[str, Any]:
        message = self.public_message()
        if request_id and not self.expose:
            message = f"{message} (request id {request_id})"
        return {"error": {"message": message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def to_shape(self, shape: ErrorShape, request_id: str | None = None) -> dict[str, Any]:
        """The error body in ``shape``: OpenAI's (``to_payload``), TEI's, Cohere's or
        Voyage's."""
        if shape == "openai":
            return self.to_payload(request_id)
        message = self.to_payload(request_id)["error"]["message"]
        if shape == "tei":  # TEI's two fields, then Blitz's field and code
            return {"error": message, "error_type": self.tei_type, "param": self.param,
                    "code": self.code}
        if shape == "voyage":  # what the voyageai client reads, then Blitz's field and code
            return {"detail": message, "param": self.param, "code": self.code}
        return {"id": request_id, "message": message}


class ClientError(BlitzError):
    """Caused by the request (4xx); its message says what to change, for the client."""

    expose = True
    tei_type = "validation"


class BadRequest(ClientError):
    status, type, code = 400, "invalid_request_error", "bad_request"
    expose = True


class Unauthorized(ClientError):
    status, type, code = 401, "authentication_error", "invalid_api_key"
    expose = True


class Forbidden(ClientError):
    status, type, code = 403, "permission_error", "forbidden"
    expose = True


class NotFound(ClientError):
    status, type, code = 404, "not_found_error", "not_found"
    expose = True


class UnknownModel(NotFound):
    code = "model_not_found"
    expose = True


class MethodNotAllowed(ClientError):
    """A known route called with a method it does not take; the reply's ``Allow`` names them."""

    status, type, code = 405, "invalid_request_error", "method_not_allowed"
    expose = True


class Conflict(ClientError):
    """The request contradicts the server's state (an id taken, a model of the config
    removed); the message says what to change first."""

    status, type, code = 409, "invalid_request_error", "conflict"
    expose = True


class RequestTimeout(ClientError):
    """The request's body did not arrive in time; the connection is closed after the reply
    (the rest of the body may still be on its way)."""

    status, type, code = 408, "invalid_request_error", "request_timeout"
    expose = True
    close_connection = True


class PayloadTooLarge(ClientError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"
    expose = True


class InputTooLong(PayloadTooLarge):
    """One input has more tokens than the model takes, and the request said ``truncate:
    false`` or ``long_inputs`` (the request's or the model's) is error."""

    code = "input_too_long"
    expose = True

    def __init__(self, message: str, param: str | None = None, index: int = 0,
                 tokens: int = 0, limit: int = 0):
        super().__init__(message, param)
        self.index, self.tokens, self.limit = index, tokens, limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.param, self.index, self.tokens, self.limit))

    @classmethod
    def at(cls, index: int, tokens: int, limit: int) -> InputTooLong:
        return cls(
            f"input {index} has {tokens} tokens, more than the model's max_seq_length of "
            f"{limit}; shorten it, or send truncate: true (with long_inputs truncate) or "
            "long_inputs: chunk",
            param="input", index=index, tokens=tokens, limit=limit,
        )

    def shifted(self, offset: int) -> InputTooLong:
        """The same error for a chunk that starts at ``offset`` in the whole request."""
        return self.at(self.index + offset, self.tokens, self.limit)


class InvalidValue(ClientError):
    status, type, code = 422, "invalid_request_error", "invalid_value"
    expose = True


class LimitReached(ClientError):
    """The caller is at one of its own limits (a key's running batches): 429; the same
    request succeeds once it is under it again."""

    status, type, code = 429, "rate_limit_error", "limit_reached"
    expose = True


class RetryLater(BlitzError):
    """The service cannot answer now (503); the same request may succeed after
    ``retry_after_s``. Not the request's fault; the message, written for the client,
    names no server internals."""

    status, type, code = 503, "unavailable_error", "unavailable"
    expose = True
    retry_after_s = 2
    tei_type = "unhealthy"


class Overloaded(RetryLater):
    status, type, code = 503, "overloaded_error", "overloaded"
    expose = True
    tei_type = "overloaded"
    retry_after_s = 1


class Unavailable(RetryLater):
    """A pool replica died or could not be reached; retrying shortly is safe."""

    status, type, code = 503, "unavailable_error", "unavailable"
    expose = True
    retry_after_s = 2


class TimedOut(Unavailable):
    code = "timeout"
    expose = True


class NotReady(RetryLater):
    status, type, code = 503, "unavailable_error", "not_ready"
    expose = True
    retry_after_s = 5


class LoadProblem(Exception):  # noqa: N818 - a problem, reported as one
    """Why a model cannot load, as a layer under the loader says it (a source, the model
    cache, the trust check, the accuracy guard): a plain error, not an HTTP one, with the
    full ``message`` for the server log and an optional ``hint`` a client may read. The
    loader's boundary (``blitz.loading.failures.as_load_failure``) makes each into the
    one ``ModelLoadFailed`` a client gets; each layer raises a subclass of its own."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.hint))


class ModelLoadFailed(BlitzError):
    """A registered model could not be loaded. ``message`` (paths, URIs, exception text)
    goes to the server log; the client reads which model failed, the request id and, when
    the raiser wrote one, a ``hint`` free of server detail (what was refused and why)."""

    status, type, code = 424, "model_load_error", "model_load_failed"
    expose = False  # public_message() is the fixed text (and the hint)

    def __init__(self, message: str, param: str | None = None, model: str | None = None,
                 hint: str | None = None):
        super().__init__(message, param)
        self.model = model
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.param, self.model, self.hint))

    def public_message(self) -> str:
        which = f"model {self.model!r}" if self.model else "the model"
        return f"{which} failed to load; {self.hint or 'the server log has the cause'}"


class ModelTooLarge(BlitzError):
    """A model that cannot fit in its pool's memory budget even with every other model
    evicted: refused before it loads (nothing is evicted for it). Not the request's fault
    and not transient, so 507 (Insufficient Storage) with no ``Retry-After``; the message
    names the model's bytes and the budget, for the operator to act on
    (``max_batch_tokens``, ``memory_bytes``, another pool or device)."""

    status, type, code = 507, "model_load_error", "model_too_large"
    expose = True


class InternalError(BlitzError):
    """An unexpected failure; the client sees only the request id."""

    expose = False


ECHO_CHARS = 64


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A client-supplied value as an error message may repeat it: at most ``limit`` chars."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def as_blitz_error(exc: BaseException) -> BlitzError:
    """The ``BlitzError`` to answer for ``exc``; anything unknown is an ``InternalError``.

    The one place that unwraps an error raised in another process: Ray wraps it (a
    ``RayTaskError``) and the original rides along as ``.cause``.
    """
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BlitzError):
        return cause
    if isinstance(exc, BlitzError):
        return exc
    return InternalError(f"{type(exc).__name__}: {exc}")
