"""The model table: what the admin API changed, one entry per model id, and the changes.

An entry is either a model the admin API added (its ``spec``) or a model of the config
that was pinned or evicted (no spec: the config keeps it). ``pinned`` keeps a model
loaded on every replica of its pools (and out of their LRU's reach); each evict bumps
``evictions``, and a replica holding the model unloads it when it sees the new number.

``ModelAdmin`` makes the changes: an added model is checked as a config's would be (its
spec's validation, its id against every served one, the settings' own checks with it
among the models, the trust check of a local source before anything else sees it); the
accuracy guard and the trust check of a downloaded source run where every model's do, in
the replica's load, and a failure there shows in the model's load state.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from blitz.admin.store import CHANGED, MODELS, FileMirror, Store
from blitz.errors import Conflict, InvalidValue, UnknownModel, echo
from blitz.loading.fetch import resolve_source
from blitz.loading.model_trust import check_model_folder
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from blitz.settings.registry import ModelSpec, Registry

MAX_PINNED = MAX_MODELS_PER_REPLICA - 1  # a replica keeps one slot for everything else


@dataclass(frozen=True)
class Entry:
    id: str
    spec: dict[str, Any] | None = None  # an added model's spec; None: the config's model
    pinned: bool = False
    evictions: int = 0  # evicts asked for so far
    changed_at: float = 0.0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Entry:
        fields = json.loads(data)
        return cls(id=str(fields["id"]), spec=fields.get("spec"),
                   pinned=bool(fields.get("pinned", False)),
                   evictions=int(fields.get("evictions", 0)),
                   changed_at=float(fields.get("changed_at", 0.0)))

    def model_spec(self) -> ModelSpec | None:
        return None if self.spec is None else ModelSpec.model_validate(self.spec)


def read_entries(store: Store) -> dict[str, Entry]:
    """The table, by model id (an entry that no longer parses is left out)."""
    entries = {}
    for key in store.keys(MODELS):
        data = store.get(key)
        if data is None:
            continue
        try:
            entry = Entry.from_json(data)
            entry.model_spec()
        except (ValueError, KeyError, TypeError, ValidationError):
            continue
        entries[entry.id] = entry
    return entries


def added_specs(entries: dict[str, Entry]) -> list[ModelSpec]:
    return [spec for e in entries.values() if (spec := e.model_spec()) is not None]


class ModelAdmin:
    """The table's changes, each written to ``store`` (and ``mirror``) at once."""

    def __init__(self, settings: BlitzSettings, store: Store, mirror: FileMirror | None = None):
        self.settings = settings
        self.store = store
        self.mirror = mirror
        self._config = settings.registry()
        self.on_change: Callable[[], None] | None = None  # after each change (its thread)

    def entries(self) -> dict[str, Entry]:
        return read_entries(self.store)

    def add(self, spec: dict[str, Any], pin: bool = False) -> Entry:
        """Add a model; ``Conflict`` if its id is served already, ``InvalidValue`` if it
        is not a model the config could name."""
        if not isinstance(spec, dict):
            raise InvalidValue("`model` must be an object: a model entry as in the config's "
                               "`models` list", param="model")
        try:
            model = ModelSpec.model_validate(spec)
        except ValidationError as exc:
            raise InvalidValue(f"invalid model entry: {_first_error(exc)}",
                               param="model") from None
        entries = self.entries()
        served = Registry(self.settings.models)
        served.set_added(added_specs(entries))
        if model.id in served:
            where = "the config" if served.in_config(model.id) else "the admin API"
            raise Conflict(f"model id {model.id!r} is served already (from {where}); remove "
                           "it first or choose another id", param="id")
        try:  # the settings' own checks, with this model among the config's
            BlitzSettings.model_validate(
                {**self.settings.model_dump(exclude={"models"}),
                 "models": [*self.settings.models, model]}, context={"size": False})
        except ValidationError as exc:
            raise InvalidValue(f"invalid model entry: {_first_error(exc)}",
                               param="model") from None
        if model.location().is_local and not model.is_fake:  # refused before any replica
            try:                                             # opens it
                check_model_folder(model, resolve_source(model))
            except Exception as exc:  # noqa: BLE001 - a missing source or untrusted code
                raise InvalidValue(getattr(exc, "hint", None) or str(exc),
                                   param="source") from None
        if pin:
            self._check_pins(entries, model.id)
        entry = Entry(model.id, model.model_dump(mode="json", exclude_defaults=True),
                      pinned=pin, changed_at=time.time())
        self._write(put=entry)
        return entry

    def remove(self, model_id: str) -> None:
        entries = self.entries()
        if self._config_has(model_id):
            raise Conflict(f"model {echo(model_id)!r} is in the config; the admin API removes "
                           "only models it added (edit the config and redeploy)", param="id")
        if model_id not in entries or entries[model_id].spec is None:
            raise self._unknown(model_id, entries)
        self._write(gone=model_id)

    def pin(self, model_id: str, pinned: bool = True) -> Entry:
        entries = self.entries()
        entry = self._entry(model_id, entries)
        if pinned:
            self._check_pins(entries, model_id)
        entry = Entry(entry.id, entry.spec, pinned, entry.evictions, time.time())
        self._write(put=entry)
        return entry

    def evict(self, model_id: str) -> Entry:
        """Unload the model from every replica now (its entry stays; a pin is dropped:
        a pinned model would load again at once)."""
        entries = self.entries()
        entry = self._entry(model_id, entries)
        entry = Entry(entry.id, entry.spec, False, entry.evictions + 1, time.time())
        self._write(put=entry)
        return entry

    # ---- helpers ---------------------------------------------------------------------

    def _config_has(self, model_id: str) -> bool:
        return model_id in self._config

    def _entry(self, model_id: str, entries: dict[str, Entry]) -> Entry:
        if model_id in entries:
            return entries[model_id]
        if self._config_has(model_id):
            return Entry(model_id)
        raise self._unknown(model_id, entries)

    def _unknown(self, model_id: str, entries: dict[str, Entry]) -> UnknownModel:
        known = sorted({s.id for s in self.settings.models}
                       | {i for i, e in entries.items() if e.spec is not None})
        return UnknownModel(f"model {echo(model_id)!r} is not served here; known models: "
                            f"{', '.join(known)}", param="id")

    def _check_pins(self, entries: dict[str, Entry], model_id: str) -> None:
        pinned = sorted(i for i, e in entries.items() if e.pinned and i != model_id)
        if len(pinned) >= MAX_PINNED:
            raise Conflict(f"{len(pinned)} models are pinned already ({', '.join(pinned)}); a "
                           f"replica holds {MAX_MODELS_PER_REPLICA} and keeps one slot for the "
                           "rest: unpin one first", param="pinned")

    def _write(self, put: Entry | None = None, gone: str | None = None) -> None:
        """One entry put or deleted (another replica's change to another model stands),
        then the mirror, then the change token (replicas read the table after they see it
        change)."""
        if put is not None:
            self.store.put(MODELS + put.id, put.to_json())
        if gone is not None:
            self.store.delete(MODELS + gone)
        if self.mirror is not None:
            self.mirror.write({i: json.loads(e.to_json()) for i, e in self.entries().items()})
        self.store.put(CHANGED, secrets.token_hex(8).encode())
        if self.on_change is not None:
            self.on_change()


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg"))
