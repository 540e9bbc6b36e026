"""Images fetched by URL (``images.url_allow``; ``blitz embed --allow-urls``): each URL
checked as it will be sent, its host resolved once, the fetch connected to the address
checked, within one replica's slots and bytes.

- ``target``: the URL as httpx sends it (dot segments removed), refused (422) unless it
  is ``http(s)``, has no user part, no ``..`` segment and no ``%2e``, ``%2f``, ``%5c`` or
  ``\\`` in its path, and its scheme, host and port are a prefix's and its normalized path
  starts with the prefix's path (which ends in ``/``).
- ``Fetcher`` (one per process: ``shared``): resolves the host once, off the event loop
  (``getaddrinfo``; injectable), refuses a loopback, link-local, private, unspecified,
  multicast or reserved address unless ``images.url_allow_private`` lists the host or the
  address (an allow-list prefix naming an address literal lists it by itself), then
  connects to that address with the URL's own ``Host`` header and TLS server name, so a
  second DNS answer cannot move the fetch. One ``httpx.AsyncClient`` with connection
  limits; at most ``max_fetches_in_flight`` fetches and ``max_fetch_bytes_in_flight``
  bytes at once on the replica; a URL repeated in a request fetched once; one failure
  cancels the request's other fetches; each image's header checked in a thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from blitz.errors import BadRequest, BlitzError, InvalidValue, Overloaded, PayloadTooLarge
from blitz.images.decode import in_image_thread
from blitz.settings.images import ENCODED_TRICKS, ImageSettings

Resolve = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> the host's addresses (``getaddrinfo``'s, in its order)."""
Check = Callable[[bytes, str], None]
"""(an image's bytes, its field) -> None, or a 4xx: run in a thread on each fetched image."""
PORTS = {"http": 80, "https": 443}


class FetchTimedOut(BadRequest):
    status, code = 408, "image_fetch_timeout"


async def system_resolve(host: str, port: int) -> list[str]:
    """``host``'s addresses from the system's resolver, in a thread (the loop's executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# --- the URL ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """A URL allowed by the list: what is sent and where."""

    url: httpx.URL  # normalized: what httpx sends
    host: str  # ASCII (IDNA), lower case, no brackets
    port: int
    netloc: str  # the Host header: host[:port] as in the URL


def target(url: str, limits: ImageSettings, param: str) -> Target:
    """``url`` as httpx will send it, when ``limits.url_allow`` allows it; else 422."""
    got, problem = _parse(url)
    if got is not None:
        problem = _path_problem(url, got)
        if problem is None and not any(_under(got, prefix) for prefix in limits.url_allow):
            problem = ("it is not under images.url_allow" if limits.url_allow else
                       "set images.url_allow to fetch images by URL, or send the image's "
                       "bytes (base64 or a data URL)")
    if problem is not None or got is None:
        raise InvalidValue(f"this server does not fetch this URL: {problem}", param=param)
    host = got.raw_host.decode("ascii").lower()
    return Target(got, host, got.port or PORTS[got.scheme], got.netloc.decode("ascii"))


def allowed(url: str, limits: ImageSettings) -> bool:
    """Whether ``url`` is under one of ``limits.url_allow`` (``target`` without raising;
    its host's addresses are checked when it is fetched)."""
    try:
        target(url, limits, "url")
    except InvalidValue:
        return False
    return True


def _parse(url: str) -> tuple[httpx.URL | None, str | None]:
    try:
        got = httpx.URL(url)
        urlsplit(url).port  # noqa: B018 - the two parsers agree on the port, or it is refused
    except (httpx.InvalidURL, ValueError, TypeError):
        return None, "it is not a valid URL"
    if got.scheme not in PORTS or not got.raw_host:
        return None, "only http(s)://host/... URLs are fetched"
    if got.userinfo or "@" in urlsplit(url).netloc:
        return None, "a URL with a user part is not fetched"
    return got, None


def _path_problem(url: str, got: httpx.URL) -> str | None:
    """Why the URL's path may mean another path to its server than to the allow-list."""
    written = urlsplit(url).path
    sent = got.raw_path.decode("ascii", "replace").partition("?")[0]
    if ".." in written.split("/") or ".." in written.replace("\\", "/").split("/"):
        return "its path has '..' segments"
    if any(trick in path.lower() for path in (written, sent) for trick in ENCODED_TRICKS):
        return "its path holds an encoded '.', '/' or '\\' (%2e, %2f, %5c) or a '\\'"
    return None


def _under(got: httpx.URL, prefix: str) -> bool:
    want = httpx.URL(prefix)
    path = got.raw_path.partition(b"?")[0]
    return ((got.scheme, got.raw_host.lower(), got.port or PORTS[got.scheme])
            == (want.scheme, want.raw_host.lower(), want.port or PORTS[want.scheme])
            and path.startswith(want.raw_path.partition(b"?")[0] or b"/"))


# --- the address -----------------------------------------------------------------------

def address_problem(address: str, host: str, limits: ImageSettings) -> str | None:
    """Why ``host`` may not be fetched at ``address`` (one of its DNS answers), or None: a
    loopback, link-local, private, unspecified, multicast or reserved address, unless
    ``url_allow_private`` lists the host or the address, or the host is that address."""
    ip = _unmapped(ipaddress.ip_address(address.partition("%")[0]))
    kind = _special(ip)
    if kind is None or _listed(ip, host, limits):
        return None
    return (f"its host {host} resolves to a {kind} address; list the host or the address "
            "in images.url_allow_private to fetch from it")


IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _unmapped(ip: IP) -> IP:
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the IPv4 one it reaches."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _special(ip: IP) -> str | None:
    for kind, flag in (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                       ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                       ("reserved", ip.is_reserved), ("private", ip.is_private),
                       ("non-public", not ip.is_global)):
        if flag:
            return kind
    return None


def _listed(ip: IP, host: str, limits: ImageSettings) -> bool:
    try:
        if _unmapped(ipaddress.ip_address(host)) == ip:  # the allow-list names it itself
            return True
    except ValueError:
        pass
    for entry in limits.url_allow_private:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            if entry.lower().rstrip(".") == host.rstrip("."):
                return True
            continue
        if ip in network:  # (a mapped address is listed as its IPv4 address)
            return True
    return False


# --- fetching --------------------------------------------------------------------------

class Fetcher:
    """One replica's URL fetching: one client, ``max_fetches_in_flight`` slots, and a count
    of the bytes its requests' fetches hold (``max_fetch_bytes_in_flight``)."""

    def __init__(self, limits: ImageSettings, *, resolve: Resolve = system_resolve,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.limits = limits
        self.resolve = resolve
        self.transport = transport
        self.held = 0  # bytes fetched by requests whose fetches have not ended
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots = asyncio.Semaphore(limits.max_fetches_in_flight)

    def _client_for_loop(self) -> httpx.AsyncClient:
        """The client (and slots) of the running loop: made on the first fetch."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            slots = self.limits.max_fetches_in_flight
            self._client = httpx.AsyncClient(
                follow_redirects=False, trust_env=False, transport=self.transport,
                timeout=self.limits.fetch_timeout_s,
                limits=httpx.Limits(max_connections=slots, max_keepalive_connections=slots))
            self._slots = asyncio.Semaphore(slots)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = self._loop = None

    async def fetch_all(self, urls: dict[int, str], field: str,
                        check: Check | None = None) -> dict[int, bytes]:
        """Each ``urls[i]``'s bytes, each URL checked (all before any is fetched), a URL
        repeated fetched once, ``check`` run on each in a thread; the first failure
        cancels the other fetches and is raised naming ``field[i]``."""
        first: dict[str, int] = {}
        for i, url in urls.items():
            first.setdefault(url, i)
        targets = {url: target(url, self.limits, f"{field}[{i}]") for url, i in first.items()}
        budget = _Budget(self, field)
        tasks: dict[str, asyncio.Task[bytes]] = {}
        try:
            async with asyncio.TaskGroup() as group:
                for url, i in first.items():
                    tasks[url] = group.create_task(self._one(targets[url], f"{field}[{i}]",
                                                             budget, check))
        except BaseExceptionGroup as failed:
            raise _first(failed) from None
        finally:
            self.held -= budget.bytes
        return {i: tasks[url].result() for i, url in urls.items()}

    async def _one(self, where: Target, param: str, budget: _Budget,
                   check: Check | None) -> bytes:
        client = self._client_for_loop()
        wait = self.limits.fetch_timeout_s
        try:
            async with asyncio.timeout(wait):
                await self._slots.acquire()
        except TimeoutError:
            raise Overloaded(f"this server is fetching as many image URLs as it may at once "
                             f"(images.max_fetches_in_flight, "
                             f"{self.limits.max_fetches_in_flight}); retry shortly") from None
        try:
            data = await self._fetch(client, where, param, budget)
        finally:
            self._slots.release()
        if check is not None:
            await in_image_thread(check, data, param, param=param,
                                  timeout_s=self.limits.decode_timeout_s, what="check")
        return data

    async def _address(self, where: Target, param: str) -> str:
        """The one address this fetch connects to, every DNS answer checked."""
        try:
            addresses = await self.resolve(where.host, where.port)
        except OSError:
            addresses = []
        if not addresses:
            raise InvalidValue(f"the image URL's host {where.host} could not be resolved",
                               param=param)
        for address in addresses:
            problem = address_problem(address, where.host, self.limits)
            if problem:
                raise InvalidValue(f"this server does not fetch this URL: {problem}",
                                   param=param)
        return addresses[0]

    async def _fetch(self, client: httpx.AsyncClient, where: Target, param: str,
                     budget: _Budget) -> bytes:
        """The body, at most ``max_bytes``, within ``fetch_timeout_s`` from resolving to
        the last byte (the server cannot lift it), redirects not followed."""
        limits = self.limits
        chunks: list[bytes] = []
        held = 0
        try:
            async with asyncio.timeout(limits.fetch_timeout_s):
                address = await self._address(where, param)
                async with client.stream(
                        "GET", where.url.copy_with(host=address),
                        headers={"host": where.netloc},
                        extensions={"sni_hostname": where.host}) as reply:
                    if reply.status_code != 200:
                        raise InvalidValue(f"fetching the image's URL answered "
                                           f"{reply.status_code}, not 200", param=param)
                    declared = reply.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limits.max_bytes:
                        raise PayloadTooLarge(f"the image at the URL declares "
                                              f"{int(declared):,} bytes; images.max_bytes is "
                                              f"{limits.max_bytes:,}", param=param)
                    async for chunk in reply.aiter_bytes():
                        held += len(chunk)
                        if held > limits.max_bytes:
                            raise PayloadTooLarge(f"the image at the URL is over "
                                                  f"images.max_bytes ({limits.max_bytes:,})",
                                                  param=param)
                        budget.add(len(chunk))
                        chunks.append(chunk)
        except (TimeoutError, httpx.TimeoutException):
            raise FetchTimedOut(f"the image's URL did not answer whole within "
                                f"images.fetch_timeout_s ({limits.fetch_timeout_s:g} s)",
                                param=param) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise InvalidValue(f"the image's URL could not be fetched: {type(exc).__name__}",
                               param=param) from None
        return b"".join(chunks)


class _Budget:
    """One request's fetched bytes, counted in its fetcher's ``held`` too."""

    def __init__(self, fetcher: Fetcher, field: str):
        self.fetcher = fetcher
        self.field = field
        self.bytes = 0

    def add(self, size: int) -> None:
        self.bytes += size
        self.fetcher.held += size
        cap = self.fetcher.limits.max_fetch_bytes_in_flight
        if self.bytes > cap:
            raise PayloadTooLarge(f"the images this request names by URL are over "
                                  f"images.max_fetch_bytes_in_flight ({cap:,} bytes) "
                                  "together; send fewer per request", param=self.field)
        if self.fetcher.held > cap:
            raise Overloaded("this server is fetching too many image bytes at once "
                             "(images.max_fetch_bytes_in_flight); retry shortly")


def _first(failed: BaseExceptionGroup) -> BaseException:
    """The error to answer with: the first of Blitz's own, else the first raised."""
    leaves: list[BaseException] = []

    def walk(group: BaseExceptionGroup) -> None:
        for exc in group.exceptions:
            if isinstance(exc, BaseExceptionGroup):
                walk(exc)
            else:
                leaves.append(exc)

    walk(failed)
    return next((e for e in leaves if isinstance(e, BlitzError)), leaves[0])


_shared: Fetcher | None = None


def shared(limits: ImageSettings) -> Fetcher:
    """This process's fetcher for ``limits`` (an ingress replica has one ``images:``)."""
    global _shared
    if _shared is None or _shared.limits != limits:
        _shared = Fetcher(limits)
    return _shared


def fetch_one(url: str, limits: ImageSettings, *, resolve: Resolve = system_resolve,
              transport: httpx.AsyncBaseTransport | None = None) -> bytes:
    """``url``'s bytes under the same checks, from a thread with no event loop running
    (``blitz embed``'s reading workers); a refusal raises its 4xx."""
    async def run() -> bytes:
        fetcher = Fetcher(limits, resolve=resolve, transport=transport)
        try:
            return (await fetcher.fetch_all({0: url}, "image"))[0]
        finally:
            await fetcher.aclose()

    return asyncio.run(run())
