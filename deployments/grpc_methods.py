"""The ingress's gRPC methods: Serve's gRPC proxy (and, on the fast path, each ingress
replica's own gRPC server behind HAProxy) calls the deployment method named like the
RPC (``Embed`` for ``/tei.v1.Embed/Embed``), with the request message and its context.
Each is one line into ``blitz.grpc_api.servicer.TeiServicer``, counted in flight by the
replica's ``drain`` (a stop waits for it: ``blitz.runtime.draining``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from blitz.grpc_api.rpc_table import RPCS
from blitz.grpc_api.servicer import TeiServicer
from blitz.runtime.draining import Drain


def _unary(method: str) -> Callable[..., Any]:
    async def call(self: GrpcMethods, request: Any, grpc_context: Any) -> Any:
        with self.drain.held():
            return await self.grpc.unary(method, request, grpc_context)

    call.__name__ = call.__qualname__ = method  # Serve reads the method's own name
    return call


def _stream(method: str) -> Callable[..., Any]:
    async def call(self: GrpcMethods, request_stream: Any,
                   grpc_context: Any) -> AsyncIterator[Any]:
        with self.drain.held():
            async for reply in self.grpc.stream(method, request_stream, grpc_context):
                yield reply

    call.__name__ = call.__qualname__ = method
    return call


class GrpcMethods:
    """Mixed into the ingress deployments; ``grpc`` is set when they are built."""

    grpc: TeiServicer
    drain: Drain


for _rpc in RPCS:
    setattr(GrpcMethods, _rpc.method, (_stream if _rpc.streaming else _unary)(_rpc.method))
