"""API keys: one check for every front (the HTTP middleware, the gRPC servicer), and what
each key may ask for: the highest priority its requests run at (``auth.max_priority``,
``auth.priority_grants``; docs/operations.md, "Who may ask for high")."""

from __future__ import annotations

import hashlib
import hmac
import logging

from blitz.errors import Unauthorized
from blitz.hop_messages import priority_level
from blitz.settings.config import KEY_ID_PREFIX, AuthSettings

logger = logging.getLogger("blitz.auth")


class ApiKeys:
    """The keys ``auth`` resolves to, held as digests. ``check`` takes an
    ``Authorization`` value (a header, or gRPC's ``authorization`` metadata);
    ``priority`` holds a request's priority to its key's ceiling."""

    def __init__(self, auth: AuthSettings):
        keys = auth.resolved_keys()
        if auth.required and not keys:
            raise ValueError(
                "auth.required is true but no API key resolves: set auth.api_keys or "
                f"${auth.api_keys_env} in the replica's environment "
                "(runtime_env.env_vars for `serve deploy`)")
        self.count = len(keys)
        self._digests = [_digest(k.encode()) for k in keys]
        self.trust_priority_header = auth.trust_priority_header
        self.max_priority = priority_level(auth.max_priority)  # keys off: everyone's
        self._ceilings = [self.max_priority] * len(keys)  # by key index
        for name, level in auth.priority_grants.items():
            granted = [i for i, digest in enumerate(self._digests) if _names(name, digest)]
            for i in granted:
                self._ceilings[i] = priority_level(level)
            if not granted:  # named by its id here: the grant may be a key itself
                logger.warning("auth.priority_grants: %s names no API key%s: unused",
                               name if name.startswith(KEY_ID_PREFIX) else key_id(name),
                               "" if keys else " (keys are off)")

    @property
    def on(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str) -> int:
        """Raise ``Unauthorized`` unless ``authorization`` is ``Bearer <one of the keys>``;
        which key it is (its index: the same on every front, a caller's identity for the
        vector cache)."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        given = _digest(token.strip().encode())
        matched = -1
        for i, key in enumerate(self._digests):  # digests, all compared: time reveals no
            if hmac.compare_digest(given, key):  # key or length
                matched = i
        if matched < 0:
            raise Unauthorized("invalid API key")
        return matched

    def owner(self, key: int) -> str:
        """Whose files and batches a request with key index ``key`` sees
        (``blitz.batches.store``): the key's digest, or ``public`` while keys are off."""
        if 0 <= key < len(self._digests):
            return f"key-{self._digests[key].hex()[:16]}"
        return "public"

    def index_of(self, owner: str) -> int | None:
        """The key index an owner's batch runs as: -1 while keys are off (``public``), None
        when that key is configured no more."""
        if not self.on:
            return -1
        for i in range(len(self._digests)):
            if self.owner(i) == owner:
                return i
        return None

    def ceiling(self, key: int) -> int:
        """The highest priority level the key with index ``key`` (-1: none, keys off) may
        run at: its grant, else ``auth.max_priority``."""
        return self._ceilings[key] if 0 <= key < len(self._ceilings) else self.max_priority

    def priority(self, asked: int, key: int, from_header: bool = False) -> int:
        """The level a request runs at that asked for ``asked`` with key ``key``: ``asked``
        held to the key's ceiling (levels count down: high is 0), or ``asked`` itself when
        it came in the gateway's header (``from_header``) and ``auth.trust_priority_header``
        is on."""
        if from_header and self.trust_priority_header:
            return asked
        return max(asked, self.ceiling(key))


def key_id(key: str) -> str:
    """How ``auth.priority_grants`` (and the logs) name a key without writing it: its
    SHA-256's first 16 hex digits after ``sha256:``."""
    return KEY_ID_PREFIX + _digest(key.encode()).hex()[:16]


def _names(name: str, digest: bytes) -> bool:
    """Whether a grant's ``name`` (a key id, or the key itself) is the key of ``digest``."""
    if name.startswith(KEY_ID_PREFIX):
        return digest.hex().startswith(name[len(KEY_ID_PREFIX):])
    return hmac.compare_digest(_digest(name.strip().encode()), digest)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()
