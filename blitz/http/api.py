"""The HTTP API: Starlette routes over the ingress's services, behind one middleware.

Routes decode bodies, call the service and encode replies (content negotiation); request
ids, API keys, error replies, timing headers and metrics are ``RequestMiddleware``'s.
``HttpApi`` builds the ASGI app (``HttpApi.app``, what the Serve ingress serves) and is
one itself for tests (``httpx.ASGITransport``). Its routes are
``blitz.http.routes.table.ROUTES``, each a plain function over ``blitz.http.routes.kit``,
served by its ``Endpoint``.

One server speaks Blitz's API and its peers' (Hugging Face TEI, Infinity, Cohere, OpenAI)
on their own paths, so a peer's client needs only the base URL changed. Where two APIs
share a path, the request says which it speaks (docs/compatibility.md): the reply's
format is the one Accept names, else the body's own (JSON in, JSON out; msgpack in,
msgpack out), and its shape follows the body's field names (``/embed``: Blitz's
``texts`` or TEI's ``inputs``; ``/rerank``: TEI's ``texts`` or Infinity's
``documents``); a msgpack reply is always Blitz's own shape. A request in TEI's dialect
gets TEI's error body too (``ERROR_SHAPE``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from blitz.admin.table import ModelAdmin
from blitz.batches.service import BatchService
from blitz.http import openapi
from blitz.http.admin import AdminApi
from blitz.http.middleware import RequestMiddleware
from blitz.http.routes.kit import Endpoint, Kit
from blitz.http.routes.table import ROUTES, RouteSpec, batch_endpoints
from blitz.ingress.images import ImageService
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.service import EmbeddingService
from blitz.ingress.services import Services
from blitz.ingress.tokenizing import TokenService


class HttpApi:
    def __init__(self, service: Services | EmbeddingService, tokens: TokenService | None = None,
                 outputs: OutputService | None = None, admin: ModelAdmin | None = None,
                 images: ImageService | None = None, app: str = "blitz"):
        services = Services.of(service, tokens, outputs, images)  # built in one place
        self.service, self.tokens, self.outputs = services.service, services.tokens, services.outputs
        self.settings = self.service.settings
        self.kit = Kit(services)
        batches = self.settings.batches
        if batches.enabled:
            self.kit.batches = BatchService(batches, self.settings.batch_storage(app),
                                            batch_endpoints())
        # the API's routes, the hot ones first (the router tries them in order); then the
        # probes' aliases and the description, public
        self.routes = [self._route(spec) for spec in ROUTES if not spec.aside]
        public = [self._route(spec) for spec in ROUTES if spec.aside]
        self.kit.openapi = openapi.document([*self.routes, *public])
        public += AdminApi(admin, self.settings.admin).routes(  # keys of its own
            lambda handler: Endpoint(self.kit, _without_kit(handler)))
        self.kit.docs = openapi.docs_page(self.kit.openapi)
        router = Router([*self.routes, *public])
        # the ASGI app itself (what Serve serves: HttpApi only builds it)
        self.app = RequestMiddleware(router, [r.path for r in self.routes],
                                     self.settings.auth, self.service.observe,
                                     self.settings.ingress.server_timing)
        self.drain = self.app.drain  # the replica's stop (deployments/draining.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @property
    def _openapi(self) -> dict[str, Any]:
        return self.kit.openapi

    @property
    def _buffered(self) -> int:
        """Bytes of request bodies being read now (``limits.max_buffered_bytes``)."""
        return self.kit.buffered

    def _route(self, spec: RouteSpec) -> Route:
        return Route(spec.path, Endpoint(self.kit, spec.run, body=spec.body is not None,
                                         tei=spec.tei, variants=spec.variants),
                     methods=[spec.method], name=spec.run.__name__)


def _without_kit(handler: Any) -> Any:
    """``handler(request, payload)`` (the admin API's) as a route, ``run(kit, request,
    payload)``."""
    async def run(kit: Kit, request: Request, payload: Any) -> Response:
        return await handler(request, payload)
    run.__name__, run.__doc__ = handler.__name__, handler.__doc__
    return run
