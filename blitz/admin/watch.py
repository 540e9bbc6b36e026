"""How a replica follows the model table, and says what it holds.

``ModelWatch`` reads the store's change token every ``admin.poll_s`` (one small read);
when it changed, the table: the replica's registry then serves the added models, and the
replica learns which models to unload now (removed, given another spec, or evicted by the
admin API) and which to keep loaded (pinned). Reading is I/O (the deployment runs it in
a thread); applying is quick and runs on the replica's event loop.

``LoadReport`` is the other way: each pool replica writes what it holds, loads and failed
to load under ``replicas/<pool>/<replica>``, when that changes and every
``REPORT_EVERY_S``; the admin API's listing reads them all (``load_states``). A replica
that died leaves its report behind: one older than ``STALE_S`` is not shown, and one
older than ``FORGOTTEN_S`` is deleted by the reader.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from blitz.admin.store import CHANGED, REPLICAS, Store
from blitz.admin.table import Entry, added_specs, read_entries
from blitz.settings.registry import Registry

REPORT_EVERY_S = 10.0
STALE_S = 30.0
FORGOTTEN_S = 600.0


@dataclass
class Changes:
    """What one new version of the table asks of a replica."""

    respecified: set[str] = field(default_factory=set)  # served before, spec changed or gone
    evict: set[str] = field(default_factory=set)  # to unload now, if held
    pinned: set[str] = field(default_factory=set)  # every pinned model served here


@dataclass
class Read:
    token: bytes | None
    entries: dict[str, Entry] | None  # None: the token did not change


class ModelWatch:
    def __init__(self, store: Store, registry: Registry):
        self.store = store
        self.registry = registry
        self.entries: dict[str, Entry] = {}
        self.pinned: set[str] = set()
        self._token: bytes | None = None
        self._evictions: dict[str, int] | None = None  # None: nothing read yet

    def read(self) -> Read:
        """The token, and the table if the token changed (blocking I/O)."""
        token = self.store.get(CHANGED)
        if self._evictions is not None and token == self._token:
            return Read(token, None)
        return Read(token, read_entries(self.store))

    def apply(self, read: Read) -> Changes | None:
        """The registry updated to ``read``'s table; what else changed (None: nothing)."""
        if read.entries is None:
            return None
        first = self._evictions is None
        before = self._evictions or {}
        entries = read.entries
        respecified = self.registry.set_added(added_specs(entries))
        evict = set(respecified)
        if not first:  # a replica that starts holds nothing evicted before it
            evict |= {i for i, e in entries.items() if e.evictions != before.get(i, 0)}
        self._evictions = {i: e.evictions for i, e in entries.items()}
        self._token = read.token
        self.entries = entries
        self.pinned = {i for i, e in entries.items() if e.pinned and i in self.registry}
        return Changes(respecified, evict, set(self.pinned))

    def poll(self) -> Changes | None:
        """``read`` and ``apply`` in one (tests, and callers off the event loop)."""
        return self.apply(self.read())


class LoadReport:
    """One pool replica's report of its models' states."""

    def __init__(self, store: Store, pool: str, replica: str,
                 clock: Any = time.time):
        self.store = store
        self.key = f"{REPLICAS}{pool}/{replica}"
        self.pool, self.replica = pool, replica
        self._clock = clock
        self._last: dict[str, Any] | None = None
        self._written_at = 0.0

    def write(self, models: dict[str, dict[str, Any]]) -> bool:
        """Write ``models`` (id -> its state) if they changed or the last write is
        ``REPORT_EVERY_S`` old; whether it wrote (blocking I/O)."""
        now = self._clock()
        if models == self._last and now - self._written_at < REPORT_EVERY_S:
            return False
        self.store.put(self.key, json.dumps({"pool": self.pool, "replica": self.replica,
                                             "at": now, "models": models}).encode())
        self._last, self._written_at = models, now
        return True

    def close(self) -> None:
        self.store.delete(self.key)


def load_states(store: Store, now: float | None = None) -> list[dict[str, Any]]:
    """Every live pool replica's report, oldest forgotten (blocking I/O)."""
    now = time.time() if now is None else now
    reports = []
    for key in store.keys(REPLICAS):
        data = store.get(key)
        try:
            report: dict[str, Any] = json.loads(data or b"null")
            age = now - float(report["at"])
        except (ValueError, TypeError, KeyError):
            continue
        if age > FORGOTTEN_S:
            store.delete(key)
        elif age <= STALE_S:
            reports.append(report)
    return reports
