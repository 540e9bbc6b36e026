"""An error reply's fields, whichever API's shape it has: OpenAI's ``{"error": {message,
type, param, code}}`` (Blitz's own), Hugging Face TEI's ``{"error", "error_type"}`` (plus
Blitz's ``param`` and ``code``), Cohere's ``{"id", "message"}`` or Voyage's ``{"detail"}``
(plus Blitz's ``param`` and ``code``)."""

from __future__ import annotations

from typing import Any


def error_body(response: Any) -> dict[str, Any]:
    """``{message, param, code, ...}`` of an error reply (an httpx or requests response)."""
    body = response.json()
    error = body.get("error")
    if isinstance(error, dict):  # OpenAI's, Blitz's own
        return error
    if isinstance(error, str):  # TEI's
        assert body["error_type"] in {"validation", "overloaded", "unhealthy", "backend",
                                      "tokenizer", "empty"}, body
        return {"message": error, "type": body["error_type"], "param": body.get("param"),
                "code": body.get("code")}
    if "detail" in body:  # Voyage's
        return {"message": body["detail"], "param": body.get("param"),
                "code": body.get("code")}
    return {"message": body["message"], "param": None, "code": None}  # Cohere's
