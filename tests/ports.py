"""Ports for test servers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def stable_port(taken: set[int]) -> int:
    """A free port below the ephemeral range (and above Ray's worker ports, 10002-19999),
    for servers started in a child process: a port the kernel hands out can be taken by
    one of Ray's own connections before the child binds it."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(500):
        port = random.randint(20000, max(20001, ephemeral - 1))
        if port not in taken and port_free(port):
            taken.add(port)
            return port
    pytest.fail("no free port below the ephemeral range")
