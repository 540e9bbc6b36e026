"""The model table as the admin API shows it (HTTP, the handle, ``blitz models``)."""

from __future__ import annotations

from typing import Any

from blitz.admin.table import Entry, ModelAdmin
from blitz.admin.watch import load_states

NOT_LOADED = {"state": "not loaded"}


def listing(admin: ModelAdmin) -> list[dict[str, Any]]:
    """Every model, the config's first, with its pin and each live pool replica's state
    of it: loaded (and its backend), loading (seconds so far), queued, failed (why, as a
    client may read it) or not loaded (blocking I/O)."""
    entries, reports = admin.entries(), load_states(admin.store)
    shown = [entries.get(spec.id, Entry(spec.id)) for spec in admin.settings.models]
    shown += [e for _, e in sorted(entries.items()) if e.spec is not None]
    return [entry_row(entry) | {"replicas": [
        {"pool": r.get("pool"), "replica": r.get("replica"),
         **r.get("models", {}).get(entry.id, NOT_LOADED)} for r in reports]}
        for entry in shown]


def entry_row(entry: Entry) -> dict[str, Any]:
    """One entry: its id, where it comes from (``config`` or ``admin``), its pin, the
    evicts asked for, and an added model's entry."""
    row: dict[str, Any] = {"id": entry.id, "from": "admin" if entry.spec else "config",
                           "pinned": entry.pinned, "evictions": entry.evictions}
    if entry.spec is not None:
        row["model"] = entry.spec
    return row
