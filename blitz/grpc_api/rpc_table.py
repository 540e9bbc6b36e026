"""Hugging Face TEI's gRPC services (``tei.v1``, ``tei.proto`` here) as one table.

``tei_pb2`` is protoc's output for ``tei.proto`` (TEI 1.9's file, unchanged, so its
clients work as they are). protoc's ``tei_pb2_grpc`` is not used: the registration
functions below are built from ``RPCS``, the one list of every method, its message types
and its kind (unary, or a stream both ways), and Ray Serve's gRPC proxy takes them by
import path (``grpc_options.grpc_servicer_functions``). The servicer they are given is
never called: Serve replaces every handler with one that sends the call to the ingress
deployment's method of the same name (``deployments/grpc_methods.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from blitz.errors import BlitzError
from blitz.grpc_api import tei_pb2 as pb
from blitz.runtime import tracing

PACKAGE = "tei.v1"


@dataclass(frozen=True)
class Rpc:
    service: str  # "Embed": the service's name inside the package
    method: str  # "EmbedStream": unique across the package, so Serve routes by it alone
    request: Any  # the request message class
    response: Any  # the response message class
    streaming: bool = False  # a stream of requests in, one reply per request out

    @property
    def path(self) -> str:
        """The method's full name on the wire: ``/tei.v1.Embed/EmbedStream``."""
        return f"/{PACKAGE}.{self.service}/{self.method}"

    def span(self, metadata: Mapping[str, Any]) -> tracing.RequestSpan | None:
        """A call's span while traces are on (``tei.v1.Embed/Embed``, SERVER), a child of
        the ``traceparent`` in its ``metadata`` (``blitz.runtime.tracing``)."""
        return tracing.start_request(self.path[1:], metadata, {
            "rpc.system": "grpc", "rpc.service": f"{PACKAGE}.{self.service}",
            "rpc.method": self.method})


def end_span(record: Any, error: BlitzError | None) -> None:
    """End the span of a call's ``record`` (a ``RequestRecord``), if it has one: an error
    span when the server failed it (a 5xx error; a client's error is its own)."""
    if record.trace is not None:
        record.trace.end(record, error is not None and error.status >= 500, {})


RPCS = (
    Rpc("Info", "Info", pb.InfoRequest, pb.InfoResponse),
    Rpc("Embed", "Embed", pb.EmbedRequest, pb.EmbedResponse),
    Rpc("Embed", "EmbedStream", pb.EmbedRequest, pb.EmbedResponse, True),
    Rpc("Embed", "EmbedSparse", pb.EmbedSparseRequest, pb.EmbedSparseResponse),
    Rpc("Embed", "EmbedSparseStream", pb.EmbedSparseRequest, pb.EmbedSparseResponse, True),
    Rpc("Embed", "EmbedAll", pb.EmbedAllRequest, pb.EmbedAllResponse),
    Rpc("Embed", "EmbedAllStream", pb.EmbedAllRequest, pb.EmbedAllResponse, True),
    Rpc("Predict", "Predict", pb.PredictRequest, pb.PredictResponse),
    Rpc("Predict", "PredictPair", pb.PredictPairRequest, pb.PredictResponse),
    Rpc("Predict", "PredictStream", pb.PredictRequest, pb.PredictResponse, True),
    Rpc("Predict", "PredictPairStream", pb.PredictPairRequest, pb.PredictResponse, True),
    Rpc("Rerank", "Rerank", pb.RerankRequest, pb.RerankResponse),
    Rpc("Tokenize", "Tokenize", pb.EncodeRequest, pb.EncodeResponse),
    Rpc("Tokenize", "TokenizeStream", pb.EncodeRequest, pb.EncodeResponse, True),
    Rpc("Tokenize", "Decode", pb.DecodeRequest, pb.DecodeResponse),
    Rpc("Tokenize", "DecodeStream", pb.DecodeRequest, pb.DecodeResponse, True),
)
"""Every method Blitz serves. Left out of TEI's proto: ``RerankStream`` (a stream of
(query, text) pairs answered once at its end; one ``Rerank`` call carries the same)."""

BY_METHOD = {rpc.method: rpc for rpc in RPCS}
SERVICES = tuple(dict.fromkeys(rpc.service for rpc in RPCS))


@dataclass(frozen=True)
class Malformed:
    """What arrives in place of a message whose bytes do not parse: the servicer answers it
    INVALID_ARGUMENT (a deserializer that raised would make grpc answer UNKNOWN)."""

    expected: str  # the message type's full name
    reason: str


def reader(message: Any) -> Callable[[bytes], Any]:
    """``message``'s parser for a stranger's bytes (protobuf's own: linear in their size)."""
    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return Malformed(message.DESCRIPTOR.full_name, str(exc))

    return parse


def _handler(rpc: Rpc, servicer: Any) -> grpc.RpcMethodHandler:
    kind = grpc.stream_stream_rpc_method_handler if rpc.streaming else \
        grpc.unary_unary_rpc_method_handler
    return kind(getattr(servicer, rpc.method, None), request_deserializer=reader(rpc.request),
                response_serializer=rpc.response.SerializeToString)


def _adder(service: str) -> Callable[[Any, Any], None]:
    def add(servicer: Any, server: Any) -> None:
        handlers = {rpc.method: _handler(rpc, servicer) for rpc in RPCS
                    if rpc.service == service}
        name = f"{PACKAGE}.{service}"
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)

    add.__name__ = add.__qualname__ = f"add_{service}Servicer_to_server"
    add.__doc__ = f"Register ``{PACKAGE}.{service}``'s methods on a gRPC server."
    return add


add_InfoServicer_to_server = _adder("Info")  # noqa: N816 - protoc's names, which Serve's docs use
add_EmbedServicer_to_server = _adder("Embed")  # noqa: N816
add_PredictServicer_to_server = _adder("Predict")  # noqa: N816
add_RerankServicer_to_server = _adder("Rerank")  # noqa: N816
add_TokenizeServicer_to_server = _adder("Tokenize")  # noqa: N816

SERVICER_FUNCTIONS = tuple(f"{__name__}.add_{service}Servicer_to_server" for service in SERVICES)
"""``grpc_options.grpc_servicer_functions`` for every service above."""


def client_method(channel: Any, method: str) -> Any:
    """A callable for ``method`` on a ``grpc`` or ``grpc.aio`` channel (a client's stub,
    without protoc's generated one)."""
    rpc = BY_METHOD[method]
    make = channel.stream_stream if rpc.streaming else channel.unary_unary
    return make(rpc.path, request_serializer=rpc.request.SerializeToString,
                response_deserializer=rpc.response.FromString)
