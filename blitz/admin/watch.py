"""How a replica follows the model table, and says what it holds.

``ModelWatch`` reads the store's change token every ``admin.poll_s`` (one small read)
while the admin API is on (an admin key set) or a table exists; with neither (the default:
nothing can change but through the handle's admin calls), every ``FIRST_TABLE_S``, until
one does (``poll_every``). When the token changed, the table: the replica's registry then serves the added models, and the
replica learns which models to unload now (removed, given another spec, or evicted by the
admin API) and which to keep loaded (pinned). Reading is I/O (the deployment runs it in
a thread); applying is quick and runs on the replica's event loop, or in the admin call's
thread: one apply at a time, and a read of an older version than the one applied is
ignored (reads finish out of order). A watch given the file mirror writes each newer
version it reads to it, so every ingress's copy is as new as what it saw.

``PinRetries`` spaces a pinned model's loads that keep failing: the first again after the
pool's ``load_failure_ttl_s``, each next twice as long after, at most ``MOST_S``.

``LoadReport`` is the other way: each pool replica writes what it holds, loads and failed
to load under ``replicas/<pool>/<replica>``, when that changes and every
``REPORT_EVERY_S``; the admin API's listing reads them all (``load_states``). A replica
that died leaves its report behind: one older than ``STALE_S`` is not shown, and one
older than ``FORGOTTEN_S`` is deleted by the reader.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blitz.admin.store import CHANGED, REPLICAS, FileMirror, Store, read_table
from blitz.admin.table import Entry, added_specs, parse_entries
from blitz.settings.registry import Registry

logger = logging.getLogger("blitz.admin")
REPORT_EVERY_S = 10.0
FIRST_TABLE_S = 20.0  # admin API off, no table yet: how often a replica looks for one
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
    version: int = 0  # the table's


class ModelWatch:
    def __init__(self, store: Store, registry: Registry, mirror: FileMirror | None = None):
        self.store = store
        self.registry = registry
        self.mirror = mirror
        self.entries: dict[str, Entry] = {}
        self.pinned: set[str] = set()
        self.version = 0  # of the table applied
        self._token: bytes | None = None
        self._evictions: dict[str, int] | None = None  # None: nothing read yet
        self._lock = threading.Lock()

    def read(self) -> Read:
        """The token, and the table if the token changed (blocking I/O)."""
        token = self.store.get(CHANGED)
        if self._evictions is not None and token == self._token:
            return Read(token, None)
        version, raw = read_table(self.store)
        if self.mirror is not None and version > 0:
            try:
                self.mirror.write(version, raw)  # only over an older copy
            except (OSError, ValueError) as exc:  # the table is followed all the same
                logger.warning("model table: admin.models_file not written: %s", exc)
        return Read(token, parse_entries(raw), version)

    def apply(self, read: Read) -> Changes | None:
        """The registry updated to ``read``'s table; what else changed (None: nothing, or
        ``read`` is of an older version than the one applied)."""
        if read.entries is None:
            return None
        with self._lock:
            if self._evictions is not None and read.version < self.version:
                return None
            return self._apply(read, read.entries)

    def _apply(self, read: Read, entries: dict[str, Entry]) -> Changes:
        first = self._evictions is None
        before = self._evictions or {}
        respecified = self.registry.set_added(added_specs(entries))
        evict = set(respecified)
        if not first:  # a replica that starts holds nothing evicted before it
            evict |= {i for i, e in entries.items() if e.evictions != before.get(i, 0)}
        self._evictions = {i: e.evictions for i, e in entries.items()}
        self._token, self.version = read.token, read.version
        self.entries = entries
        self.pinned = {i for i, e in entries.items() if e.pinned and i in self.registry}
        return Changes(respecified, evict, set(self.pinned))

    def poll(self) -> Changes | None:
        """``read`` and ``apply`` in one (tests, and callers off the event loop)."""
        return self.apply(self.read())

    def poll_every(self, every_s: float, admin_on: bool) -> float:
        """Seconds to the next read: ``every_s`` (``admin.poll_s``) while the admin API is
        on or a table was read; else ``FIRST_TABLE_S`` (longer, never shorter): with the
        API off and no table, only a handle's admin call can write the first one, and its
        own ingress applies it at once."""
        if admin_on or self._token is not None:
            return every_s
        return max(every_s, FIRST_TABLE_S)


class PinRetries:
    """When each pinned model that failed to load may be tried again (module docstring)."""

    MOST_S = 3600.0

    def __init__(self, first_s: float, clock: Callable[[], float] = time.monotonic):
        self.first_s = first_s
        self._clock = clock
        self._failed: dict[str, tuple[int, float]] = {}  # id -> (failures in a row, next)

    def due(self, model_id: str) -> bool:
        failed = self._failed.get(model_id)
        return failed is None or self._clock() >= failed[1]

    def failed(self, model_id: str) -> float:
        """Count a failure; the seconds until the next try."""
        count = self._failed.get(model_id, (0, 0.0))[0] + 1
        wait = min(self.first_s * 2 ** (count - 1), self.MOST_S)
        self._failed[model_id] = (count, self._clock() + wait)
        return wait

    def loaded(self, model_id: str) -> None:
        self._failed.pop(model_id, None)

    def keep_only(self, model_ids: set[str]) -> None:
        """Forget the models no longer pinned."""
        for model_id in set(self._failed) - model_ids:
            del self._failed[model_id]


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
