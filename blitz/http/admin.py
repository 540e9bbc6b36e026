"""The model admin API: models added, pinned, evicted and removed without a redeploy.

    GET    /admin/models              the config's and the added models, each with its pin,
                                      and every pool replica's load state of it
    POST   /admin/models              {"model": {a config model entry}, "pin": false}: add
    DELETE /admin/models/{id}         remove an added model
    POST   /admin/models/{id}/pin     keep it loaded on every pool replica
    POST   /admin/models/{id}/unpin
    POST   /admin/models/{id}/evict   unload it from every pool replica now

Behind its own keys (``admin.api_keys``, ``$BLITZ_ADMIN_KEYS``), apart from the API's:
with none set, every admin route answers 403. What may be added is the config's to say
(``blitz.admin.sources``: no remote code, allowed sources); each change is one audit line
naming the admin key's index. The table's writes are small blocking reads
and writes of the cluster's store: they run off the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from blitz.admin.listing import entry_row, listing
from blitz.admin.table import ModelAdmin
from blitz.errors import Forbidden, InvalidValue
from blitz.http.responses import JSONBytesResponse
from blitz.ingress.keys import ApiKeys
from blitz.settings.config import AdminSettings, AuthSettings

PREFIX = "/admin/models"


class AdminApi:
    def __init__(self, admin: ModelAdmin | None, settings: AdminSettings):
        self.admin = admin
        self.keys = ApiKeys(AuthSettings(api_keys=settings.resolved_keys(), api_keys_env=""))

    def routes(self, read: Any) -> list[Route]:
        """The routes; ``read`` wraps a ``(request, payload)`` handler into an endpoint that
        reads the body within the API's limits (``blitz.http.routes.kit``)."""
        return [Route(PREFIX, self.listing, methods=["GET"]),
                Route(PREFIX, read(self.add), methods=["POST"]),
                Route(PREFIX + "/{model_id}", self.remove, methods=["DELETE"]),
                Route(PREFIX + "/{model_id}/{action}", self.act, methods=["POST"])]

    def _admin(self, request: Request) -> tuple[ModelAdmin, str]:
        """The table, and who asks (the admin key's index, for the audit line)."""
        if not self.keys.on:
            raise Forbidden("the admin API is off: set admin.api_keys or $BLITZ_ADMIN_KEYS "
                            "(keys of its own, apart from auth.api_keys)")
        key = self.keys.check(request.headers.get("authorization", ""))
        if self.admin is None:
            raise Forbidden("this server has no model table (an ingress outside Ray Serve)")
        return self.admin, f"admin key #{key}"

    async def listing(self, request: Request) -> Response:
        admin, _ = self._admin(request)
        return JSONBytesResponse({"models": await asyncio.to_thread(listing, admin)})

    async def add(self, request: Request, payload: Any) -> Response:
        admin, who = self._admin(request)
        if not isinstance(payload, dict) or "model" not in payload:
            raise InvalidValue('send {"model": {...a model entry, as in the config...}, '
                               '"pin": false}', param="model")
        pin = payload.get("pin", False)
        if not isinstance(pin, bool):
            raise InvalidValue("pin must be true or false", param="pin")
        entry = await asyncio.to_thread(admin.add, payload["model"], pin, who)
        return JSONBytesResponse(entry_row(entry), status_code=201)

    async def remove(self, request: Request) -> Response:
        admin, who = self._admin(request)
        model_id = request.path_params["model_id"]
        await asyncio.to_thread(admin.remove, model_id, who)
        return JSONBytesResponse({"id": model_id, "removed": True})

    async def act(self, request: Request) -> Response:
        admin, who = self._admin(request)
        model_id, action = request.path_params["model_id"], request.path_params["action"]
        actions = {"pin": lambda: admin.pin(model_id, True, who),
                   "unpin": lambda: admin.pin(model_id, False, who),
                   "evict": lambda: admin.evict(model_id, who)}
        if action not in actions:
            raise InvalidValue(f"no admin action {action[:32]!r}: pin, unpin or evict",
                               param="action")
        entry = await asyncio.to_thread(actions[action])
        return JSONBytesResponse(entry_row(entry))
