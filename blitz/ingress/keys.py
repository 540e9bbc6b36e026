"""API keys: one check for every front (the HTTP middleware, the gRPC servicer)."""

from __future__ import annotations

import hashlib
import hmac

from blitz.errors import Unauthorized
from blitz.settings.config import AuthSettings


class ApiKeys:
    """The keys ``auth`` resolves to, held as digests. ``check`` takes an
    ``Authorization`` value (a header, or gRPC's ``authorization`` metadata)."""

    def __init__(self, auth: AuthSettings):
        keys = auth.resolved_keys()
        if auth.required and not keys:
            raise ValueError(
                "auth.required is true but no API key resolves: set auth.api_keys or "
                f"${auth.api_keys_env} in the replica's environment "
                "(runtime_env.env_vars for `serve deploy`)")
        self.count = len(keys)
        self._digests = [_digest(k.encode()) for k in keys]

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


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()
