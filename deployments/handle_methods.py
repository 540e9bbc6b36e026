"""The ingress's handle API, generated: ``await handle.embed.remote(texts, model=...)`` and
its siblings call the service method of the same name, with its own signature,
options and docstring, so the handle cannot drift from ``POST /embed`` and the rest. In
place of the service's internal ``record`` a method takes ``priority=`` (high | normal |
low; docs/operations.md, "Priorities"): the queues' order for the model work it sends.

``HANDLE_METHODS`` is derived from the HTTP route table (``blitz.http.routes.table``): what a
handle offers is the service calls the routes make, each named as its function is, with
the service the ingress holds (``service``, ``outputs``, ``tokens``, ``images``, ``parts`` or ``late``);
``info`` is a function of the service (``blitz.ingress.status.info``), the others its
methods. As ``deployments/grpc_methods.py`` does for gRPC, each becomes a method of
``HandleMethods``, mixed into both ingresses.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from blitz.batches.service import BatchService
from blitz.errors import NotFound
from blitz.hop_messages import priority_level
from blitz.http.routes.table import service_calls
from blitz.ingress.images import ImageService
from blitz.ingress.late_interaction import LateInteractionService
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.parts import PartsService
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.ingress.tokenizing import TokenService
from blitz.runtime.draining import Drain

INTERNAL = "record"  # the services' parameter that the handle does not offer
PRIORITY = "priority"  # what it offers in its place: high | normal | low (default normal)
HANDLE_METHODS: dict[str, tuple[str, Callable[..., Any]]] = {
    function.__name__: (holder, function) for holder, function in service_calls()}


def _method(name: str, holder: str, function: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(function)
    recorded = INTERNAL in signature.parameters  # it takes a priority (tokenize and decode
    # run no model: theirs changes nothing)

    async def call(self: HandleMethods, *args: Any, **kwargs: Any) -> Any:
        if INTERNAL in kwargs:  # the request record is the service's own, never a caller's
            raise TypeError(f"{name}() got an unexpected keyword argument {INTERNAL!r}")
        priority = kwargs.pop(PRIORITY, None) if recorded else None
        target = getattr(self, holder)
        if target is None:  # a service that is off (the batch API's: batches.enabled)
            raise NotFound(f"{name}: the batch API is off on this server (batches.enabled)")
        with self.drain.held():  # a stop waits for it (blitz.runtime.draining)
            if priority is None:
                result = function(target, *args, **kwargs)
                return await result if inspect.isawaitable(result) else result
            record = RequestRecord(f"handle.{name}")  # as the service names its own
            with self.service.observed(record):
                record.priority = priority_level(priority)
                return await function(target, *args, record=record, **kwargs)

    call.__name__ = call.__qualname__ = name  # Serve finds a handle's method by its name
    call.__doc__ = f"Handle API: ``await handle.{name}.remote(...)``.\n\n{function.__doc__}"
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter(PRIORITY, inspect.Parameter.KEYWORD_ONLY, default=None,
                                      annotation="str | None") if p.name == INTERNAL else p
                    for p in signature.parameters.values()])
    return call


class HandleMethods:
    """Mixed into the ingress deployments; the services are set when they are built."""

    service: EmbeddingService
    outputs: OutputService
    tokens: TokenService
    images: ImageService
    parts: PartsService
    late: LateInteractionService
    batches: BatchService | None  # None while the batch API is off: its calls raise
    drain: Drain


for _name, (_holder, _function) in HANDLE_METHODS.items():
    setattr(HandleMethods, _name, _method(_name, _holder, _function))
