"""A replica's inter-deployment gRPC server on its node's address, not on every interface.

Serve 2.60 binds that server to ``[::]:0`` whatever the node's address (replica.py
``_on_initialized``: ``add_port_to_grpc_server(self._server, "[::]:0")``), so a node
started on 127.0.0.1 (scripts/ray_up.py, the single-machine start) still has every
replica listening on all interfaces, reachable from the network. Callers reach a replica
at its node's address (the replica reports ``ray.util.get_node_ip_address()``), so
binding there instead changes nothing for them. Only a loopback node is changed: on a
cluster the node's address is routable and Serve's choice stays.
"""

from __future__ import annotations

import logging

import ray
from ray.serve._private import default_impl
from ray.serve._private import replica as serve_replica

from blitz.http.middleware import is_loopback

logger = logging.getLogger("ray.serve")

ANY = "[::]:0"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _bind(server, address: str, _original=serve_replica.add_port_to_grpc_server) -> int:
    if address == ANY:
        node_ip = ray.util.get_node_ip_address()
        if node_ip in _LOOPBACK:
            address = f"[{node_ip}]:0" if ":" in node_ip else f"{node_ip}:0"
    return _original(server, address)


def keep_replica_grpc_on_node_ip() -> None:
    """Call in a replica's constructor: Serve starts the server after it returns."""
    if getattr(serve_replica, "add_port_to_grpc_server", None) is not _bind:
        serve_replica.add_port_to_grpc_server = _bind


# --- the gRPC API's servers: where HTTP listens ---------------------------------------

_ANY_HOST = "[::]:"
_grpc_host: list[str | None] = []  # Serve's http_options.host, once read in this process


def _grpc_address(server, address: str, _original=default_impl.add_grpc_address):
    host = _grpc_host[0] if _grpc_host else None
    if address.startswith(_ANY_HOST) and host and is_loopback(host):
        port = address[len(_ANY_HOST):]
        address = f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"
    return _original(server, address)


def keep_grpc_on_http_host(host: str | None) -> None:
    """Serve 2.60's gRPC servers (the proxy's on ``grpc_options.port``, and each ingress
    replica's direct-ingress one behind HAProxy) bind ``[::]:<port>`` whatever
    ``http_options.host`` says (grpc_util.py ``start_grpc_server``), while HAProxy's gRPC
    frontend binds that host (haproxy.py ``grpc_frontend_host``: "reuse the HTTP host so
    both proxies bind on the same interface"). With a loopback ``host`` (the
    single-machine start), bind them there too; any other host keeps Serve's choice."""
    if not _grpc_host:
        _grpc_host.append(host)
    if default_impl.add_grpc_address is not _grpc_address:
        default_impl.add_grpc_address = _grpc_address  # type: ignore[assignment]


def http_host() -> str | None:
    """The host Serve's HTTP proxies listen on (``http_options.host``); None if unknown."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        return client.http_config.host if client is not None else None
    except Exception:  # noqa: BLE001 - a start is not failed for it: gRPC keeps Serve's bind
        logger.warning("cannot read Serve's http_options.host; gRPC servers keep Serve's "
                       "bind", exc_info=True)
        return None


def grpc_proxy_callback() -> list:
    """``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (serve_config.yaml): Serve calls it
    in each proxy's constructor, before the proxy starts its gRPC server. Adds no HTTP
    middleware; keeps that server on a loopback HTTP host (``keep_grpc_on_http_host``)."""
    keep_grpc_on_http_host(_grpc_host[0] if _grpc_host else http_host())
    return []
