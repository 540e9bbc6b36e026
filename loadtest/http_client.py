"""The load generator's HTTP clients: one ``post`` for every API, on aiohttp or httpx.

On a small machine the client shares the cores with the server it measures, so its CPU
per request is taken from the server's throughput. With 32 connections in one pool,
httpx spent ~1.4-1.7 CPU-ms per single-text request here, a third of it checking every pooled
connection's expiry on each request; aiohttp (C HTTP parser, per-host connection lists)
spends a fraction of that (BENCHMARKS.md). aiohttp is the default on the network; httpx
stays for tests, whose ``transport`` (``httpx.ASGITransport``, ``MockTransport``) replaces
the network, and on request (``--http-client httpx``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

HTTP_CLIENTS = ("aiohttp", "httpx")
# Failures a server or network can cause; anything else is a bug here and stops the run.
TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


@dataclass(frozen=True)
class HttpReply:
    status_code: int
    content: bytes
    headers: Mapping[str, str]  # case-insensitive


class HttpClient(Protocol):
    async def post(self, path: str, content: bytes, headers: Mapping[str, str]) -> HttpReply: ...

    async def aclose(self) -> None: ...


class AiohttpClient:
    def __init__(self, base_url: str, headers: Mapping[str, str], timeout_s: float,
                 connections: int):
        self.base_url = base_url.rstrip("/")
        connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
        self.session = aiohttp.ClientSession(
            headers=dict(headers), connector=connector,
            timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def post(self, path: str, content: bytes, headers: Mapping[str, str]) -> HttpReply:
        async with self.session.post(self.base_url + path, data=content,
                                     headers=dict(headers)) as response:
            return HttpReply(response.status, await response.read(), response.headers)

    async def aclose(self) -> None:
        await self.session.close()


class HttpxClient:
    def __init__(self, base_url: str, headers: Mapping[str, str], timeout_s: float,
                 connections: int, transport: httpx.AsyncBaseTransport | None = None):
        limits = httpx.Limits(max_connections=connections,
                              max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(base_url=base_url, headers=dict(headers),
                                        timeout=httpx.Timeout(timeout_s), limits=limits,
                                        transport=transport)

    async def post(self, path: str, content: bytes, headers: Mapping[str, str]) -> HttpReply:
        response = await self.client.post(path, content=content, headers=dict(headers))
        return HttpReply(response.status_code, response.content, response.headers)

    async def aclose(self) -> None:
        await self.client.aclose()


def make_http_client(kind: str, base_url: str, headers: Mapping[str, str], timeout_s: float,
                     connections: int,
                     transport: httpx.AsyncBaseTransport | None = None) -> HttpClient:
    """One client whose pool holds one connection per worker; a ``transport`` (tests)
    always gets httpx, the only one that can take it."""
    if transport is not None or kind == "httpx":
        return HttpxClient(base_url, headers, timeout_s, connections, transport)
    return AiohttpClient(base_url, headers, timeout_s, connections)  # LoadConfig checked kind
