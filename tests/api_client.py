"""The unit tests' way to the HTTP API: the services built as the ingress builds them
(``blitz.ingress.services.Services.build``), the API over them, an httpx client on it in
process (``httpx.ASGITransport``). One place, so every API test runs the same assembly.

    async with api_client(settings) as client:          # the replica in process, pool "cpu"
    async with api_client(settings, dispatcher) as c:   # the test's own dispatcher
    async with api_client(service_or_api) as client:    # an EmbeddingService, Services or HttpApi
    tei = tei_servicer(service)                          # TEI's gRPC services, the same way
"""

from __future__ import annotations

from typing import Any

import httpx

from blitz.admin.table import ModelAdmin
from blitz.grpc_api.servicer import TeiServicer
from blitz.http.api import HttpApi
from blitz.ingress.service import Dispatcher, EmbeddingService, Observer
from blitz.ingress.services import Services
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings

BASE_URL = "http://blitz"
CPU = frozenset({"cpu"})


def services_for(settings: BlitzSettings, dispatcher: Dispatcher | None = None, *,
                 observer: Observer | None = None, pools: frozenset[str] = CPU) -> Services:
    """The services over ``dispatcher`` (default: the production pool replica in this
    process, ``blitz.pool.dispatcher.ReplicaDispatcher``, answering for ``pools``)."""
    return Services.build(settings, dispatcher or ReplicaDispatcher(settings, pools=pools),
                          observer=observer)


def tei_servicer(app: BlitzSettings | EmbeddingService | Services,
                 dispatcher: Dispatcher | None = None) -> TeiServicer:
    """TEI's gRPC services over ``app`` (settings, a service or the services), as the
    ingress builds them."""
    if isinstance(app, BlitzSettings):
        app = services_for(app, dispatcher)
    services = Services.of(app)
    return TeiServicer(services.service, services.tokens, services.outputs)


def api_for(app: BlitzSettings | EmbeddingService | Services | HttpApi,
            dispatcher: Dispatcher | None = None, *, admin: ModelAdmin | None = None,
            observer: Observer | None = None, pools: frozenset[str] = CPU) -> HttpApi:
    """The HTTP API over ``app``: settings (its services built here), a service, the
    services, or an API already made (returned as it is)."""
    if isinstance(app, HttpApi):
        return app
    if isinstance(app, BlitzSettings):
        app = services_for(app, dispatcher, observer=observer, pools=pools)
    return HttpApi(app, admin=admin)


def api_transport(app: BlitzSettings | EmbeddingService | Services | HttpApi,
                  dispatcher: Dispatcher | None = None, *, root_path: str = "",
                  **api: Any) -> httpx.ASGITransport:
    """An httpx transport to the HTTP API over ``app`` (``api_for``), in process: for
    Blitz's own Python client (``blitz.client``), or an httpx client of the test's."""
    return httpx.ASGITransport(api_for(app, dispatcher, **api), root_path=root_path)


def api_client(app: BlitzSettings | EmbeddingService | Services | HttpApi,
               dispatcher: Dispatcher | None = None, *, admin: ModelAdmin | None = None,
               observer: Observer | None = None, pools: frozenset[str] = CPU,
               root_path: str = "", **client: Any) -> httpx.AsyncClient:
    """An httpx client on the HTTP API over ``app`` (``api_for``), in process; ``client``
    passes on to ``httpx.AsyncClient`` (``timeout``, ``headers``)."""
    return httpx.AsyncClient(
        transport=api_transport(app, dispatcher, admin=admin, observer=observer, pools=pools,
                                root_path=root_path),
        base_url=BASE_URL + root_path, **client)
