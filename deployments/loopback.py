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

import ray
from ray.serve._private import replica as serve_replica

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
