"""The error table: statuses, wire fields, who may read the text, and pickling."""

from __future__ import annotations

import pickle

import pytest

from blitz.errors import (
    BadRequest,
    ClientError,
    InputTooLong,
    InternalError,
    InvalidValue,
    MethodNotAllowed,
    ModelLoadFailed,
    ModelTooLarge,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    RetryLater,
    TimedOut,
    Unauthorized,
    Unavailable,
    UnknownModel,
    as_blitz_error,
)

# class, status, type, code, whether its text is shown, Retry-After
TABLE = [
    (BadRequest, 400, "invalid_request_error", "bad_request", True, None),
    (Unauthorized, 401, "authentication_error", "invalid_api_key", True, None),
    (NotFound, 404, "not_found_error", "not_found", True, None),
    (UnknownModel, 404, "not_found_error", "model_not_found", True, None),
    (MethodNotAllowed, 405, "invalid_request_error", "method_not_allowed", True, None),
    (PayloadTooLarge, 413, "invalid_request_error", "payload_too_large", True, None),
    (InputTooLong, 413, "invalid_request_error", "input_too_long", True, None),
    (InvalidValue, 422, "invalid_request_error", "invalid_value", True, None),
    (ModelLoadFailed, 424, "model_load_error", "model_load_failed", False, None),
    (ModelTooLarge, 507, "model_load_error", "model_too_large", True, None),
    (Overloaded, 503, "overloaded_error", "overloaded", True, 1),
    (Unavailable, 503, "unavailable_error", "unavailable", True, 2),
    (TimedOut, 503, "unavailable_error", "timeout", True, 2),
    (NotReady, 503, "unavailable_error", "not_ready", True, 5),
    (InternalError, 500, "internal_error", "internal_error", False, None),
]


@pytest.mark.parametrize(("cls", "status", "type_", "code", "expose", "retry_after"), TABLE)
def test_status_table(cls, status, type_, code, expose, retry_after):
    error = cls("the message", param="p")
    assert (error.status, error.type, error.code) == (status, type_, code)
    assert error.expose is expose and error.retry_after_s == retry_after
    payload = error.to_payload("req-1")["error"]
    assert set(payload) == {"message", "type", "param", "code"}
    assert (payload["type"], payload["code"], payload["param"]) == (type_, code, "p")
    assert ("the message" in payload["message"]) is expose
    assert ("req-1" in payload["message"]) is not expose


def test_client_errors_are_the_requests_fault_and_503s_are_not():
    for cls, status, *_ in TABLE:
        assert issubclass(cls, ClientError) == (400 <= status < 424), cls.__name__
        assert issubclass(cls, RetryLater) == (status == 503), cls.__name__
        assert (cls.retry_after_s is not None) == issubclass(cls, RetryLater)


def test_a_load_failure_shows_only_which_model_failed():
    error = ModelLoadFailed("model 'm': directory '/srv/secret' does not exist", model="m")
    message = error.to_payload("req-9")["error"]["message"]
    assert "'m'" in message and "req-9" in message and "/srv/secret" not in message
    assert "secret" not in InternalError("KeyError: secret").to_payload()["error"]["message"]


@pytest.mark.parametrize("error", [
    BadRequest("bad", param="texts"),
    InputTooLong.at(3, 700, 512),
    ModelLoadFailed("why", model="m"),
    TimedOut("slow"),
    NotReady("later"),
    InternalError("boom"),
])
def test_errors_pickle_with_their_fields(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and vars(again) == vars(error)


def test_as_blitz_error_unwraps_a_remote_cause_once():
    class Wrapped(Exception):  # what Ray raises for an error in another process
        def __init__(self, cause):
            super().__init__("wrapped")
            self.cause = cause

    cause = Overloaded("full")
    assert as_blitz_error(Wrapped(cause)) is cause
    assert as_blitz_error(cause) is cause
    unknown = as_blitz_error(Wrapped(KeyError("k")))
    assert isinstance(unknown, InternalError) and not unknown.expose
