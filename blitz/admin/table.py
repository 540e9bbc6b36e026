"""The model table: what the admin API changed, one entry per model id, and the changes.

An entry is either a model the admin API added (its ``spec``) or a model of the config
that was pinned or evicted (no spec: the config keeps it). ``pinned`` keeps a model
loaded on every replica of its pools (and out of their LRU's reach); each evict bumps
``evictions``, and a replica holding the model unloads it when it sees the new number.

``ModelAdmin`` makes the changes: an added model is checked as a config's would be (its
spec's validation, its id against every served one, the settings' own checks with it
among the models), against the config's admin policy (``blitz.admin.sources``: no remote
code, allowed sources), and its local files before anything else sees them (a folder's
trust check; a package's name against the installed distributions, nothing imported); the
accuracy guard and the trust check of a downloaded source run where every model's do, in
the replica's load, and a failure there shows in the model's load state.

Each change is a compare-and-set on the table's version (``blitz.admin.store.commit``):
read the table, check the change against it (no id added twice, at most ``MAX_PINNED``
pins), write it as the next version; if another ingress replica wrote that version
first, read again and check again. Each change, done or refused, is one line on the
``blitz.admin`` logger: who (the admin key's index, or the handle), what, the result.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from blitz.admin.sources import SourcePolicy
from blitz.admin.store import FileMirror, Store, commit, read_table
from blitz.errors import BlitzError, Conflict, InvalidValue, Unavailable, UnknownModel, echo
from blitz.loading.fetch import check_package, resolve_source
from blitz.loading.model_trust import check_model_folder
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from blitz.settings.registry import ModelSpec, Registry

MAX_PINNED = MAX_MODELS_PER_REPLICA - 1  # a replica keeps one slot for everything else
CHANGE_TRIES = 16  # reads and checks of one change while other changes win the version
audit = logging.getLogger("blitz.admin")


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
    def from_json(cls, data: bytes | str | dict) -> Entry:
        fields = data if isinstance(data, dict) else json.loads(data)
        return cls(id=str(fields["id"]), spec=fields.get("spec"),
                   pinned=bool(fields.get("pinned", False)),
                   evictions=int(fields.get("evictions", 0)),
                   changed_at=float(fields.get("changed_at", 0.0)))

    def model_spec(self) -> ModelSpec | None:
        return None if self.spec is None else ModelSpec.model_validate(self.spec)


def parse_entries(raw: dict[str, dict]) -> dict[str, Entry]:
    """The table's JSON entries, by model id (one that no longer parses is left out)."""
    entries = {}
    for fields in raw.values():
        try:
            entry = Entry.from_json(fields)
            entry.model_spec()
        except (ValueError, KeyError, TypeError, ValidationError):
            continue
        entries[entry.id] = entry
    return entries


def read_entries(store: Store) -> dict[str, Entry]:
    """The newest table, by model id."""
    return parse_entries(read_table(store)[1])


def added_specs(entries: dict[str, Entry]) -> list[ModelSpec]:
    return [spec for e in entries.values() if (spec := e.model_spec()) is not None]


Change = Callable[[dict[str, Entry]], tuple[dict[str, Entry], Entry | None]]


class ModelAdmin:
    """The table's changes, each written to ``store`` (and ``mirror``) at once. ``who``
    of each change names the caller in the audit line (``key #<index>``, ``handle``)."""

    def __init__(self, settings: BlitzSettings, store: Store, mirror: FileMirror | None = None):
        self.settings = settings
        self.store = store
        self.mirror = mirror
        self._config = settings.registry()
        self.policy = SourcePolicy(settings.admin, list(settings.models))
        self.version = 0  # the table's version after this admin's last change
        self.on_change: Callable[[], None] | None = None  # after each change (its thread)

    def entries(self) -> dict[str, Entry]:
        return read_entries(self.store)

    def add(self, spec: dict[str, Any], pin: bool = False, who: str = "handle") -> Entry:
        """Add a model; ``Conflict`` if its id is served already, ``Forbidden`` if the
        admin policy refuses it, ``InvalidValue`` if it is not a model the config could
        name."""
        fields = spec if isinstance(spec, dict) else {}
        what = f"add {echo(fields.get('id'))!r} from {echo(fields.get('source'))!r}"
        return self._audited(who, what + (" pinned" if pin else ""),
                             lambda: self._add(spec, pin))

    def remove(self, model_id: str, who: str = "handle") -> None:
        def change(entries: dict[str, Entry]) -> tuple[dict[str, Entry], Entry | None]:
            if self._config_has(model_id):
                raise Conflict(f"model {echo(model_id)!r} is in the config; the admin API "
                               "removes only models it added (edit the config and "
                               "redeploy)", param="id")
            if model_id not in entries or entries[model_id].spec is None:
                raise self._unknown(model_id, entries)
            return {i: e for i, e in entries.items() if i != model_id}, None

        self._audited(who, f"remove {echo(model_id)!r}", lambda: self._change(change))

    def pin(self, model_id: str, pinned: bool = True, who: str = "handle") -> Entry:
        def change(entries: dict[str, Entry]) -> tuple[dict[str, Entry], Entry | None]:
            entry = self._entry(model_id, entries)
            if pinned:
                self._check_pins(entries, model_id)
            entry = Entry(entry.id, entry.spec, pinned, entry.evictions, time.time())
            return entries | {model_id: entry}, entry

        return self._audited(who, f"{'pin' if pinned else 'unpin'} {echo(model_id)!r}",
                             lambda: self._change(change))

    def evict(self, model_id: str, who: str = "handle") -> Entry:
        """Unload the model from every replica now (its entry stays; a pin is dropped:
        a pinned model would load again at once)."""
        def change(entries: dict[str, Entry]) -> tuple[dict[str, Entry], Entry | None]:
            entry = self._entry(model_id, entries)
            entry = Entry(entry.id, entry.spec, False, entry.evictions + 1, time.time())
            return entries | {model_id: entry}, entry

        return self._audited(who, f"evict {echo(model_id)!r}", lambda: self._change(change))

    # ---- helpers ---------------------------------------------------------------------

    def _add(self, spec: dict[str, Any], pin: bool) -> Entry:
        model = self._checked(spec)

        def change(entries: dict[str, Entry]) -> tuple[dict[str, Entry], Entry | None]:
            self._check_new_id(model.id, entries)
            if pin:
                self._check_pins(entries, model.id)
            entry = Entry(model.id, model.model_dump(mode="json", exclude_defaults=True),
                          pinned=pin, changed_at=time.time())
            return entries | {model.id: entry}, entry

        entry = self._change(change)
        assert entry is not None
        return entry

    def _checked(self, spec: dict[str, Any]) -> ModelSpec:
        """``spec`` as a model entry that may be added (what the table does not decide)."""
        if not isinstance(spec, dict):
            raise InvalidValue("`model` must be an object: a model entry as in the config's "
                               "`models` list", param="model")
        try:
            model = ModelSpec.model_validate(spec)
        except ValidationError as exc:
            raise InvalidValue(f"invalid model entry: {_first_error(exc)}",
                               param="model") from None
        self._check_new_id(model.id, self.entries())  # the table checks it again
        model = self.policy.check(model)  # remote code, allowed sources
        try:  # the settings' own checks, with this model among the config's
            BlitzSettings.model_validate(
                {**self.settings.model_dump(exclude={"models"}),
                 "models": [*self.settings.models, model]}, context={"size": False})
        except ValidationError as exc:
            raise InvalidValue(f"invalid model entry: {_first_error(exc)}",
                               param="model") from None
        scheme = model.location().scheme
        try:  # refused before any replica opens it; a package is never imported here
            if scheme == "package":
                check_package(model)
            elif scheme == "dir":
                check_model_folder(model, resolve_source(model))
        except Exception as exc:  # noqa: BLE001 - a missing source or untrusted code
            raise InvalidValue(getattr(exc, "hint", None) or str(exc),
                               param="model.source") from None
        return model

    def _check_new_id(self, model_id: str, entries: dict[str, Entry]) -> None:
        served = Registry(self.settings.models)
        served.set_added(added_specs(entries))
        if model_id in served:
            where = "the config" if served.in_config(model_id) else "the admin API"
            raise Conflict(f"model id {model_id!r} is served already (from {where}); remove "
                           "it first or choose another id", param="id")

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

    def _change(self, change: Change) -> Entry | None:
        """``change`` applied to the newest table and written as its next version; again
        on the newer table while another writer wins the version (``CHANGE_TRIES``).
        Then the mirror, and ``on_change``."""
        if self.mirror is not None:
            self.mirror.check()  # a foreign file: refused before anything is written
        for _ in range(CHANGE_TRIES):
            version, raw = read_table(self.store)
            entries = parse_entries(raw)
            changed, result = change(entries)
            kept = {i: fields for i, fields in raw.items() if i not in entries}  # unparsed
            table = kept | {i: json.loads(e.to_json()) for i, e in changed.items()}
            if commit(self.store, version + 1, table):
                self.version = version + 1
                if self.mirror is not None:
                    try:  # the change stands: the next version seen is written again
                        self.mirror.write(version + 1, table)
                    except OSError as exc:
                        audit.warning("model table: admin.models_file not written: %s", exc)
                if self.on_change is not None:
                    self.on_change()
                return result
        raise Unavailable(f"the model table changed {CHANGE_TRIES} times while this change "
                          "was checked against it; retry")

    def _audited(self, who: str, what: str, run: Callable[[], Any]) -> Any:
        """``run()``, and one audit line of who asked for what, and what came of it."""
        try:
            result = run()
        except BlitzError as exc:
            audit.warning("admin change by %s: %s: refused, %d %s: %s", who, what, exc.status,
                          exc.code, exc.message)
            raise
        except Exception as exc:
            audit.error("admin change by %s: %s: failed, %s: %s", who, what,
                        type(exc).__name__, exc)
            raise
        audit.info("admin change by %s: %s: done, table version %d", who, what, self.version)
        return result


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg"))
