"""OpenAI's file and batch objects as the batch API answers and keeps them, and its lists.

A record on disk is the object the API answers plus Blitz's own fields, named with a
leading ``_`` (``public`` leaves them out).
"""

from __future__ import annotations

from typing import Any

# a batch's states, as OpenAI names them; the ended ones never change again
VALIDATING, FAILED, IN_PROGRESS, FINALIZING = "validating", "failed", "in_progress", "finalizing"
COMPLETED, EXPIRED, CANCELLING, CANCELLED = "completed", "expired", "cancelling", "cancelled"
ENDED = frozenset({FAILED, COMPLETED, EXPIRED, CANCELLED})
PURPOSE_IN, PURPOSE_OUT = "batch", "batch_output"


def file_object(file_id: str, filename: str, purpose: str, size: int, created_at: int,
                expires_at: int | None) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at,
            "filename": filename, "purpose": purpose, "status": "processed",
            "status_details": None, "expires_at": expires_at}


def batch_object(batch_id: str, endpoint: str, input_file_id: str, window: str,
                 created_at: int, expires_at: int,
                 metadata: dict[str, str] | None) -> dict[str, Any]:
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": window,
            "status": VALIDATING, "output_file_id": None, "error_file_id": None,
            "created_at": created_at, "in_progress_at": None, "expires_at": expires_at,
            "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata}


def public(record: dict[str, Any]) -> dict[str, Any]:
    """The object as the API answers it: Blitz's own ``_`` fields left out."""
    return {k: v for k, v in record.items() if not k.startswith("_")}


def errors_list(problems: list[dict[str, Any]]) -> dict[str, Any]:
    """A failed batch's ``errors``: OpenAI's {object: "list", data: [{code, message,
    param, line}]}."""
    return {"object": "list", "data": problems}


def page(objects: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's list: ``objects`` (in the list's order) after the one whose id is
    ``after``, at most ``limit`` of them, and whether more follow."""
    start = 0
    if after:
        ids = [o["id"] for o in objects]
        start = ids.index(after) + 1 if after in ids else len(objects)
    data = [public(o) for o in objects[start:start + limit]]
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": start + limit < len(objects)}
