"""Images by URL (issue 54, M1 and M2; ``blitz.images.fetch``): the allow-list compared on
the path httpx sends, the host resolved once (an injected resolver: no network) and
private addresses refused unless listed, the fetch connected to the address checked, and
one replica's fetches bounded: slots, bytes, repeats fetched once, a failure cancels the
rest, header checks in a thread."""

from __future__ import annotations

import asyncio
import http.server
import io
import threading

import httpx
import pytest
from PIL import Image
from pydantic import ValidationError

from blitz.errors import InvalidValue, Overloaded, PayloadTooLarge
from blitz.images.fetch import Fetcher, address_problem, allowed, shared
from blitz.images.inputs import image_bytes
from blitz.settings.images import ImageSettings


def png(size: tuple[int, int] = (8, 8)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


PNG = png()


def resolver(table: dict[str, list[str]], calls: list[str] | None = None):
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        return table[host]
    return resolve


class Seen(http.server.BaseHTTPRequestHandler):
    """A loopback server: every GET answers a PNG and is recorded (path, Host header)."""

    seen: list[tuple[str, str]] = []

    def do_GET(self):  # noqa: N802 - the handler's name
        Seen.seen.append((self.path, self.headers.get("host", "")))
        self.send_response(200)
        self.send_header("content-length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *_):
        pass


@pytest.fixture(scope="module")
def port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Seen)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def refused(error: pytest.ExceptionInfo, param: str, *words: str) -> None:
    assert error.value.param == param and 400 <= error.value.status < 500
    for word in words:
        assert word in error.value.message, error.value.message


# --- M1: the path as it is sent ---------------------------------------------------------

def test_dot_segments_and_encoded_separators_are_refused_and_paths_compared_as_sent():
    limits = ImageSettings(url_allow=["https://img.example.com/public/"])
    assert allowed("https://img.example.com/public/a.png", limits)
    assert allowed("https://IMG.example.com:443/public/./sub/a.png", limits)
    for url in ("https://img.example.com/public/../admin/secret",  # httpx sends /admin/secret
                "https://img.example.com/public/%2e%2e/admin/secret",
                "https://img.example.com/public/%2E%2E/admin",
                "https://img.example.com/public/.%2e/admin",
                "https://img.example.com/public/a%2fb.png",
                "https://img.example.com/public/a%2Fb.png",
                "https://img.example.com/public/..%5cadmin",
                "https://img.example.com/public/..\\admin",
                "https://img.example.com/public-internal/a.png",
                "https://img.example.com/publica.png",
                "https://user@img.example.com/public/a.png"):
        assert not allowed(url, limits), url

    async def run():
        fetcher = Fetcher(limits, resolve=resolver({}))  # nothing is resolved
        with pytest.raises(InvalidValue) as error:
            await image_bytes([PNG, "https://img.example.com/public/../admin/x.png"], limits,
                              fetcher=fetcher)
        refused(error, "images[1]", "'..'")
        with pytest.raises(InvalidValue) as error:
            await image_bytes(["https://img.example.com/public/%2E%2e/admin/x.png"], limits,
                              fetcher=fetcher)
        refused(error, "images[0]", "%2e")

    asyncio.run(run())


def test_a_prefix_must_end_in_a_slash_and_private_entries_be_hosts_or_cidrs():
    with pytest.raises(ValidationError, match="must end in '/'"):
        ImageSettings(url_allow=["https://img.example.com/public"])
    with pytest.raises(ValidationError, match=r"'\.\.'"):
        ImageSettings(url_allow=["https://img.example.com/a/../b/"])
    assert ImageSettings(url_allow=["https://img.example.com"]).url_allow  # the whole host
    with pytest.raises(ValidationError, match="url_allow_private"):
        ImageSettings(url_allow_private=["http://x/"])
    ImageSettings(url_allow_private=["img.internal", "10.1.0.0/16", "fd00::/8", "::1"])


# --- M1: the address ---------------------------------------------------------------------

@pytest.mark.parametrize("address,kind", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.2.3.4", "private"),
    ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fc00::1", "private"),
    ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"), ("240.0.0.1", "reserved"),
    ("100.64.0.1", "non-public")])
def test_addresses_that_are_not_public_are_refused_unless_listed(address, kind):
    limits = ImageSettings()
    assert kind in address_problem(address, "img.test", limits)
    assert address_problem("93.184.216.34", "img.test", limits) is None
    assert address_problem("2606:2800:220:1::1", "img.test", limits) is None
    listed = ImageSettings(url_allow_private=["IMG.test"])
    assert address_problem(address, "img.test", listed) is None
    unmapped = address.removeprefix("::ffff:")  # a mapped address is listed as IPv4's
    by_address = ImageSettings(url_allow_private=[unmapped + ("/128" if ":" in unmapped
                                                              else "/32")])
    assert address_problem(address, "other.test", by_address) is None
    assert address_problem(address, address, limits) is None  # a literal listed by itself


def test_a_name_that_resolves_to_a_private_address_is_refused_before_any_connection(port):
    Seen.seen.clear()
    limits = ImageSettings(url_allow=[f"http://img.test:{port}/", "http://meta.test/",
                                      f"http://mixed.test:{port}/"])
    table = {"img.test": ["127.0.0.1"], "meta.test": ["169.254.169.254"],
             "mixed.test": ["93.184.216.34", "10.0.0.7"]}

    async def run():
        fetcher = Fetcher(limits, resolve=resolver(table))
        for i, (url, kind) in enumerate(((f"http://img.test:{port}/a.png", "loopback"),
                                         ("http://meta.test/latest/meta-data/", "link-local"),
                                         (f"http://mixed.test:{port}/a.png", "private"))):
            with pytest.raises(InvalidValue) as error:
                await image_bytes([PNG] * i + [url], limits, fetcher=fetcher)
            refused(error, f"images[{i}]", kind, "images.url_allow_private")
        await fetcher.aclose()

    asyncio.run(run())
    assert Seen.seen == []


def test_a_listed_private_host_is_resolved_once_and_connected_at_the_address_checked(port):
    Seen.seen.clear()
    calls: list[str] = []
    limits = ImageSettings(url_allow=[f"http://img.test:{port}/"],
                           url_allow_private=["img.test"])
    url = f"http://img.test:{port}/ok.png"

    async def run():
        fetcher = Fetcher(limits, resolve=resolver({"img.test": ["127.0.0.1"]}, calls))
        try:
            return await image_bytes([url, PNG, url, url], limits, fetcher=fetcher)
        finally:
            await fetcher.aclose()

    assert asyncio.run(run()) == [PNG] * 4
    assert calls == ["img.test"]  # resolved once, the repeats fetched once
    assert Seen.seen == [("/ok.png", f"img.test:{port}")]  # at 127.0.0.1, its own Host


def test_the_system_resolver_is_used_by_default_and_localhost_is_loopback(port):
    limits = ImageSettings(url_allow=[f"http://localhost:{port}/"])

    async def run():
        fetcher = Fetcher(limits)
        with pytest.raises(InvalidValue) as error:
            await image_bytes([f"http://localhost:{port}/a.png"], limits, fetcher=fetcher)
        refused(error, "images[0]", "loopback")

    asyncio.run(run())


def test_https_is_sent_to_the_address_with_the_host_s_name_for_tls_and_host():
    got: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        got.append(request)
        return httpx.Response(200, content=PNG)

    limits = ImageSettings(url_allow=["https://img.test/"])

    async def run():
        fetcher = Fetcher(limits, resolve=resolver({"img.test": ["93.184.216.34"]}),
                          transport=httpx.MockTransport(answer))
        try:
            return await image_bytes(["https://img.test/a/b.png?x=1"], limits,
                                     fetcher=fetcher)
        finally:
            await fetcher.aclose()

    assert asyncio.run(run()) == [PNG]
    [request] = got
    assert (request.url.host, request.url.raw_path) == ("93.184.216.34", b"/a/b.png?x=1")
    assert request.headers["host"] == "img.test"
    assert request.extensions["sni_hostname"] == "img.test"


# --- M2: one replica's fetches bounded ---------------------------------------------------

def test_one_failure_cancels_the_other_fetches():
    state: dict = {"cancelled": False}

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slow.png":
            state["started"].set()
            try:
                await asyncio.Event().wait()  # never answers
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise
        await state["started"].wait()
        return httpx.Response(404)

    limits = ImageSettings(url_allow=["https://img.test/"], fetch_timeout_s=600)

    async def run():
        state["started"] = asyncio.Event()
        fetcher = Fetcher(limits, resolve=resolver({"img.test": ["93.184.216.34"]}),
                          transport=httpx.MockTransport(answer))
        with pytest.raises(InvalidValue) as error:
            await image_bytes(["https://img.test/slow.png", "https://img.test/missing.png"],
                              limits, fetcher=fetcher)
        refused(error, "images[1]", "404")
        assert state["cancelled"]  # when the error is raised, its sibling is gone
        assert fetcher.held == 0
        await fetcher.aclose()

    asyncio.run(run())


def test_fetches_wait_for_the_replica_s_slots():
    active = {"now": 0, "most": 0}

    async def answer(request: httpx.Request) -> httpx.Response:
        active["now"] += 1
        active["most"] = max(active["most"], active["now"])
        for _ in range(20):  # let every other fetch run as far as it can
            await asyncio.sleep(0)
        active["now"] -= 1
        return httpx.Response(200, content=PNG)

    limits = ImageSettings(url_allow=["https://img.test/"], max_fetches_in_flight=2)

    async def run():
        fetcher = Fetcher(limits, resolve=resolver({"img.test": ["93.184.216.34"]}),
                          transport=httpx.MockTransport(answer))
        urls = [f"https://img.test/{i}.png" for i in range(8)]
        both = await asyncio.gather(image_bytes(urls[:4], limits, fetcher=fetcher),
                                    image_bytes(urls[4:], limits, fetcher=fetcher))
        await fetcher.aclose()
        return both

    assert asyncio.run(run()) == [[PNG] * 4] * 2
    assert active["most"] == 2


def test_bytes_held_by_fetches_are_bounded_per_request_and_per_replica():
    gate = {}

    class Held(httpx.AsyncByteStream):
        """The first half of the image, then the rest once the gate opens."""

        async def __aiter__(self):
            yield PNG[:100]
            gate["holding"].set()
            await gate["open"].wait()
            yield PNG[100:]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/held.png":
            return httpx.Response(200, stream=Held())
        return httpx.Response(200, content=PNG)

    limits = ImageSettings(url_allow=["https://img.test/"],
                           max_fetch_bytes_in_flight=len(PNG) + 50)

    async def run():
        gate.update(holding=asyncio.Event(), open=asyncio.Event())
        fetcher = Fetcher(limits, resolve=resolver({"img.test": ["93.184.216.34"]}),
                          transport=httpx.MockTransport(answer))
        with pytest.raises(PayloadTooLarge) as error:  # one request over it alone: 413
            await image_bytes(["https://img.test/a.png", "https://img.test/b.png"], limits,
                              fetcher=fetcher)
        refused(error, "images", "images.max_fetch_bytes_in_flight")
        assert fetcher.held == 0
        first = asyncio.create_task(image_bytes(["https://img.test/held.png"], limits,
                                                fetcher=fetcher))
        await gate["holding"].wait()  # 100 bytes held by the first request
        with pytest.raises(Overloaded, match="max_fetch_bytes_in_flight"):  # 503
            await image_bytes(["https://img.test/c.png"], limits, fetcher=fetcher)
        gate["open"].set()
        assert await first == [PNG]
        assert fetcher.held == 0
        await fetcher.aclose()

    asyncio.run(run())


def test_header_checks_of_fetched_images_run_off_the_event_loop():
    threads: list[int] = []
    limits = ImageSettings(url_allow=["https://img.test/"])

    def check(data: bytes, param: str) -> None:
        threads.append(threading.get_ident())

    async def run():
        fetcher = Fetcher(limits, resolve=resolver({"img.test": ["93.184.216.34"]}),
                          transport=httpx.MockTransport(lambda r: httpx.Response(200,
                                                                                 content=PNG)))
        got = await fetcher.fetch_all({0: "https://img.test/a.png", 2: "https://img.test/b"},
                                      "images", check)
        await fetcher.aclose()
        return got, threading.get_ident()

    got, loop_thread = asyncio.run(run())
    assert got == {0: PNG, 2: PNG}
    assert len(threads) == 2 and loop_thread not in threads


def test_a_replica_shares_one_fetcher_and_one_client():
    limits = ImageSettings(url_allow=["https://img.test/"])
    assert shared(limits) is shared(ImageSettings(url_allow=["https://img.test/"]))
    assert shared(ImageSettings()) is not shared(limits)

    async def run():
        fetcher = Fetcher(limits)
        client = fetcher._client_for_loop()
        assert fetcher._client_for_loop() is client
        await fetcher.aclose()

    asyncio.run(run())
