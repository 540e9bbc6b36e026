"""``python -m loadtest.request_work``: the work one request does, counted, not timed.

Requests go one at a time into the ingress's real ASGI app (``blitz.http.api.HttpApi``,
called directly: no HTTP client, no sockets), as the load generator sends them
(``loadtest.apis``, native msgpack on ``POST /embed``), through the ingress's dispatcher
and its queue into the CPU pool's replica in the same process (``ingress.cpu_pool:
in_process``: ``InProcessCpuDispatcher`` -> ``PoolReplica.run_jobs``, its queue, a worker
thread, the model), with the metrics the replicas record (``deployments.metrics``), on a
fake model (``fake:384``: it costs next to nothing, so what is counted is the path's own).
Ray's part of a served request (the proxy, Serve's replica wrapper, its multiplexed LRU:
stood in for here by a dict) is not in the count.

What is counted: Python function calls (``sys.setprofile`` on this thread and
``threading.setprofile`` on every thread started after the hook, so the pool's worker
threads too), ``call`` events and ``c_call`` events (builtins and C methods) apart, from
the request's first byte in until its reply is sent and every thread that worked on it is
back waiting for work (``CallCounter``). The metrics' flush thread (``blitz-metrics``, once
a second, not per request) is left out. After a warm-up (the first requests import and
cache), each of ``requests`` requests is counted on its own; the figure is the median.
With one request at a time and every thread parked between requests, the count is the
same request after request, up to the event loop's wake-ups (a worker thread that answers
before the loop sleeps saves it one): ``spread`` says how far apart they were.

    python -m loadtest.request_work [--requests 50] [--warmup 20] [--top 15] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NamedTuple

import blitz
from loadtest.apis import get_api

MODEL = "m"
DIMENSION = 384
ARGS: dict[str, Any] = {"models": [{"id": MODEL, "source": f"fake:{DIMENSION}"}],
                        "cpu_pool": {"workers": 2, "torch_threads": 1},
                        "ingress": {"cpu_pool": "in_process"}}
"""The shipped layout (serve_config.yaml on 2 cores: two workers, one thread each, the CPU
pool inside the ingress) on a fake model."""
PROFILES = {"single": 1, "batch32": 32}  # texts per request, as the load test's profiles
SKIPPED_THREADS = ("blitz-metrics",)  # threads whose work is not the request's
PARKED = "SimpleQueue.get"  # where an executor's idle thread waits for work
SETTLE = 3  # loop turns after a reply, for what it left ready
PARK_WAIT_S = 5.0  # a bound on waiting for the threads to park, not a timing assertion
TEXT = "the quick brown fox jumps over the lazy dog number {}"
HARNESS = str(Path(__file__).resolve().parent)  # the driver and its stand-ins for Ray
TREE = Path(blitz.__file__).resolve().parents[1]  # the tree whose blitz/ is counted


def where(code: CodeType) -> str:
    """``code``'s function as ``path:line(name)``, the path from the repository root when
    it is Blitz's, else from its ``site-packages`` or the standard library."""
    name = code.co_filename
    for root in ("site-packages/", str(TREE) + "/", "/lib/python"):  # a venv may sit in TREE
        at = name.find(root)
        if at >= 0:
            name = name[at + len(root):]
            if root == "/lib/python":
                name = "stdlib/" + name.split("/", 1)[-1]
            break
    return f"{name}:{code.co_firstlineno}({code.co_name})"


def area(code: CodeType) -> str:
    """Where ``code`` lives: a Blitz package (``blitz/http``, ``deployments``...), ``asyncio``,
    ``stdlib``, ``starlette``, or ``other``."""
    name = code.co_filename
    if name.startswith(str(TREE) + "/"):
        parts = Path(name).relative_to(TREE).parts
        return "/".join(parts[:2]) if parts[0] == "blitz" and len(parts) > 2 else parts[0]
    if "/asyncio/" in name:
        return "asyncio"
    if "site-packages/" in name:
        return name.split("site-packages/", 1)[1].split("/", 1)[0]
    if "/lib/python" in name or name.startswith("<frozen"):
        return "stdlib"
    return "other"


def blitz_own(code: CodeType) -> bool:
    """Code of the tree's ``blitz/`` and ``deployments/``."""
    name = code.co_filename
    return name.startswith((str(TREE / "blitz") + "/", str(TREE / "deployments") + "/"))


class CallCounter:
    """Counts Python calls (``call``) and C calls (``c_call``) on every thread while
    ``active``, by function. Install it (``installed``) before the app's threads start:
    ``threading.setprofile`` reaches only threads started after it."""

    def __init__(self) -> None:
        self.active = False
        self.calls: collections.Counter[CodeType] = collections.Counter()
        self.c_calls: collections.Counter[tuple[CodeType, str]] = collections.Counter()
        self._running: set[int] = set()  # threads (other than the loop's) off their queue
        self._muted: int | None = None  # a thread whose calls are not counted now

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if self.active and threading.get_ident() != self._muted:
                self.calls[frame.f_code] += 1
        elif event == "c_call":
            name = getattr(arg, "__qualname__", "?")
            if name == PARKED:
                self._running.discard(threading.get_ident())
            if self.active and threading.get_ident() != self._muted:
                self.c_calls[frame.f_code, name] += 1
        elif event == "c_return" and getattr(arg, "__qualname__", None) == PARKED:
            self._running.add(threading.get_ident())

    def _thread_hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if threading.current_thread().name.startswith(SKIPPED_THREADS):
            sys.setprofile(None)  # for this thread only
            return
        sys.setprofile(self._hook)  # from now on without the name check
        self._hook(frame, event, arg)

    @contextmanager
    def installed(self) -> Iterator[CallCounter]:
        sys.setprofile(self._hook)
        threading.setprofile(self._thread_hook)
        try:
            yield self
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
            sys.setprofile(None)

    def reset(self) -> None:
        self.calls.clear()
        self.c_calls.clear()

    async def parked(self) -> None:
        """Let the loop run what the request left ready (``SETTLE`` turns, counted), then
        wait, not counting the loop's thread, until every thread that took work is
        waiting for more."""
        for _ in range(SETTLE):
            await asyncio.sleep(0)
        self._muted = threading.get_ident()
        try:
            deadline = time.monotonic() + PARK_WAIT_S
            while self._running and time.monotonic() < deadline:
                await asyncio.sleep(0)
                self._running &= {t.ident for t in threading.enumerate()}  # not the exited
        finally:
            self._muted = None


@dataclass
class Work:
    """One request's counts: Python calls (all, and those of ``blitz/`` and
    ``deployments/``), C calls, and the calls by function."""

    calls: int
    blitz_calls: int
    c_calls: int
    by_function: dict[str, int] = field(repr=False)
    by_area: dict[str, int] = field(repr=False)


def work_of(counter: CallCounter) -> Work:
    """What ``counter`` counted, less the harness's own calls (``HARNESS``)."""
    by_function: dict[str, int] = collections.Counter()
    by_area: dict[str, int] = collections.Counter()
    blitz_calls = 0
    for code, n in counter.calls.items():
        if code.co_filename.startswith(HARNESS):
            continue
        by_function[where(code)] += n
        by_area[area(code)] += n
        blitz_calls += n if blitz_own(code) else 0
    c_calls = sum(n for (code, _), n in counter.c_calls.items()
                  if not code.co_filename.startswith(HARNESS))
    return Work(sum(by_function.values()), blitz_calls, c_calls, dict(by_function),
                dict(by_area))


@dataclass
class Measured:
    """``requests`` requests counted one by one. ``calls``: the fewest of any request (what
    varies is the event loop's wake-ups: a worker thread that answers while the loop
    sleeps costs it one more turn, 10 calls); ``blitz_calls`` (they do not vary) and
    ``c_calls`` (a few wake-ups' worth apart): the median; ``spread``: the most ``calls``
    minus the fewest; the calls by function and by area of the request with the fewest."""

    profile: str
    requests: int
    calls: int
    blitz_calls: int
    c_calls: int
    spread: int
    by_function: dict[str, int] = field(repr=False)
    by_area: dict[str, int] = field(repr=False)

    def files(self) -> list[str]:
        """The files of ``blitz/`` and ``deployments/`` whose code the request ran."""
        return sorted({name.split(":", 1)[0] for name in self.by_function
                       if name.startswith(("blitz/", "deployments/"))})

    def top(self, n: int = 15) -> list[tuple[str, int]]:
        return sorted(self.by_function.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def table(self, n: int = 15) -> str:
        lines = [f"{self.profile}: {self.calls} Python calls ({self.blitz_calls} in blitz/ and "
                 f"deployments/), {self.c_calls} C calls per request (of {self.requests}: the "
                 f"fewest; the most +{self.spread})", f"top {n} functions by calls:"]
        lines += [f"  {count:6d}  {name}" for name, count in self.top(n)]
        return "\n".join(lines)


def measured(profile: str, works: list[Work]) -> Measured:
    fewest = min(works, key=lambda w: (w.calls, w.c_calls))
    return Measured(profile, len(works), fewest.calls,
                    int(statistics.median(w.blitz_calls for w in works)),
                    int(statistics.median(w.c_calls for w in works)),
                    max(w.calls for w in works) - fewest.calls, fewest.by_function,
                    fewest.by_area)


# ---- the app and its pool ------------------------------------------------------------

class Call(NamedTuple):
    """One request ready to go: ``run`` (an ASGI call not yet started) and ``check``, which
    raises unless its reply was right (called after it, not counted)."""

    run: Awaitable[None]
    check: Callable[[], None]


Request = Callable[[], Call]
"""Makes the next request (its body built here, before any counting)."""


def asgi_call(app: Any, path: str, body: bytes, headers: dict[str, str],
              check: Callable[[int, bytes, dict[str, str]], None]) -> Call:
    """A request into ``app`` as Serve's proxy hands it over (an ASGI ``http`` scope, the
    body in one message); ``check`` gets its status, body and headers."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000),
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]
             + [(b"content-length", str(len(body)).encode())]}
    message = {"type": "http.request", "body": body, "more_body": False}
    start: dict[str, Any] = {}
    reply: list[bytes] = []
    received: list[bool] = []

    async def receive() -> dict[str, Any]:
        if not received:
            received.append(True)
            return message
        await asyncio.Event().wait()  # no disconnect: the request ends first
        raise AssertionError("unreachable")

    async def send(sent: dict[str, Any]) -> None:
        if sent["type"] == "http.response.start":
            start.update(sent)
        else:
            reply.append(sent.get("body", b""))

    def checked() -> None:
        check(start.get("status", 0), b"".join(reply),
              {k.decode(): v.decode() for k, v in start.get("headers", [])})

    return Call(app(scope, receive, send), checked)


def embed_request(app: Any, texts: int, *, model: str = MODEL, api: str = "native-msgpack",
                  extra: dict[str, Any] | None = None, unique: bool = True) -> Request:
    """``POST /embed`` of ``texts`` texts as the load generator sends them (``api``), each
    reply checked (200, one ``DIMENSION``-wide row per text); ``extra``: more fields of the
    body; ``unique``: new texts every time (else the same texts again)."""
    from blitz import codecs

    wire = get_api(api)
    numbers = itertools.count()

    def check(status: int, body: bytes, headers: dict[str, str]) -> None:
        if status != 200:
            raise AssertionError(f"POST /embed answered {status}: {body[:300]!r}")
        shape = wire.parse(body, headers).embeddings.shape
        if shape != (texts, DIMENSION):
            raise AssertionError(f"POST /embed answered {shape}, not {(texts, DIMENSION)}")

    def request() -> Call:
        n = next(numbers) if unique else 0
        sent = wire.request([TEXT.format(n * texts + i) for i in range(texts)], model)
        body = sent.body
        if extra:
            packed = sent.headers["content-type"].endswith("msgpack")
            fields = {**(codecs.unpack(body) if packed else json.loads(body)), **extra}
            body = codecs.pack(fields) if packed else json.dumps(fields).encode()
        return asgi_call(app, sent.path, body, sent.headers, check)

    return request


class ServeLru:
    """Stands in for Serve's multiplexed LRU in front of a pool replica's loads: a
    resident model is a dict lookup (Serve's own bookkeeping is Ray's, not counted)."""

    def __init__(self, load: Callable[[str], Awaitable[Any]]):
        self.load = load
        self.held: dict[str, Any] = {}

    async def __call__(self, model_id: str) -> Any:
        holder = self.held.get(model_id)
        if holder is None:
            holder = self.held[model_id] = await self.load(model_id)
        return holder


@dataclass
class Served:
    """The ingress's app and the objects behind it."""

    app: Any
    service: Any
    dispatcher: Any
    pool: Any  # what the dispatcher calls: ``run_jobs_for(model_id, jobs)``
    settings: Any


async def cpu_pool_in_process(settings: Any, args: dict[str, Any]) -> Any:
    """The CPU pool's replica as ``ingress.cpu_pool: in_process`` builds it (the replica
    logic, its events as the deployment wires them to Ray's metrics, tracing configured),
    without the model table's follower (it polls Ray's GCS): ``ReplicaDispatcher``; on
    older trees the replica with ``ServeLru`` for Serve's LRU. Trees before
    ``blitz.pool.replica`` (c8539e5) kept the logic in the deployment's class: that class,
    its Serve loader unwrapped."""
    try:
        from blitz.pool.dispatcher import ReplicaDispatcher
    except ImportError:  # a tree before it: its replica behind a stand-in of Serve's LRU
        return await _replica_in_process(settings, args)
    from blitz.runtime import tracing
    from deployments.metrics import metrics

    pool = ReplicaDispatcher(settings, "cpu", metrics.pool_events("cpu"))
    tracing.configure(settings.tracing)
    await pool.start()
    return pool


async def _replica_in_process(settings: Any, args: dict[str, Any]) -> Any:
    """``cpu_pool_in_process`` on trees before ``blitz.pool.dispatcher``."""
    try:
        from blitz.pool.replica import PoolReplica
    except ImportError:  # the baseline's layout
        from deployments import pool as old

        cls = old.ModelPool.func_or_class  # type: ignore[attr-defined]
        replica = cls.__new__(cls)
        loader = cls.get_model.__wrapped__
        replica.get_model = ServeLru(lambda model_id: loader(replica, model_id))
        await replica.__init__(args, "cpu")
        return replica
    from blitz.runtime import tracing
    from deployments.pool import _events

    replica = PoolReplica(settings, "cpu", _events("cpu"))
    tracing.configure(settings.tracing)
    replica.cached_load = ServeLru(replica.load)
    await replica.preload()

    class InProcess:  # deployments.pool.ModelPool.run_jobs_for
        async def run_jobs_for(self, model_id: str, jobs: list) -> list:
            return await replica.run_jobs(model_id, jobs)

    pool = InProcess()
    pool.replica = replica  # type: ignore[attr-defined]
    return pool


async def serve_in_process(args: dict[str, Any] | None = None) -> Served:
    """The ingress as ``IngressWithCpuPool`` builds it (deployments/ingress.py), its CPU
    pool in this process, without Ray: the service with the metrics' observers, the HTTP
    app on it. Call it on the loop that will serve the requests."""
    from blitz.http.api import HttpApi
    from blitz.ingress.service import EmbeddingService
    from blitz.settings.config import BlitzSettings
    from deployments.ingress import InProcessCpuDispatcher
    from deployments.metrics import metrics

    args = args if args is not None else ARGS
    settings = BlitzSettings.from_args(args)
    pool = await cpu_pool_in_process(settings, args)
    dispatcher = InProcessCpuDispatcher(settings, pool, {})
    service = EmbeddingService(settings, dispatcher, observer=metrics.observe_request,
                               route_observer=metrics.observe_route)
    api = HttpApi(service)
    # what the Serve ingress serves (deployments/ingress.py, __serve_build_asgi_app__): the
    # app HttpApi builds (before 2026-11-28, HttpApi itself)
    return Served(getattr(api, "app", api), service, dispatcher, pool, settings)


async def count(counter: CallCounter, request: Request, requests: int, warmup: int) -> list[Work]:
    """``warmup`` requests, then ``requests`` each counted on its own, with Python's
    cyclic garbage collector off while they run (a collection, when it happens, would
    land in one request's count: it is collected between them, uncounted, and what the
    warm-up left is frozen first, so that each collection is quick)."""
    for _ in range(warmup):
        call = request()
        await call.run
        await counter.parked()
        call.check()
    works = []
    was_enabled = gc.isenabled()
    gc.freeze()  # what exists now is not scanned again: each collection below stays quick
    try:
        for _ in range(requests):
            call = request()
            gc.collect()
            gc.disable()
            counter.reset()
            counter.active = True
            await call.run
            await counter.parked()
            counter.active = False
            if was_enabled:
                gc.enable()
            call.check()
            works.append(work_of(counter))
    finally:
        counter.active = False
        gc.unfreeze()
        if was_enabled:
            gc.enable()
    return works


async def measure_profiles(profiles: dict[str, int], requests: int, warmup: int,
                           counter: CallCounter, args: dict[str, Any] | None = None
                           ) -> dict[str, Measured]:
    """Each profile's ``Measured`` on one in-process server (``serve_in_process``)."""
    served = await serve_in_process(args)
    return {name: measured(name, await count(counter, embed_request(served.app, texts),
                                             requests, warmup))
            for name, texts in profiles.items()}


def run(profiles: dict[str, int] = PROFILES, requests: int = 50, warmup: int = 20,
        args: dict[str, Any] | None = None) -> dict[str, Measured]:
    """``measure_profiles`` in a loop of its own, with a ``CallCounter`` installed first."""
    counter = CallCounter()
    with counter.installed():
        return asyncio.run(measure_profiles(profiles, requests, warmup, counter, args))


def as_dict(m: Measured) -> dict[str, Any]:
    return dataclasses.asdict(m)


def count_tree(tree: Path, requests: int, warmup: int) -> dict[str, Measured]:
    """``run`` on another checkout's ``blitz/`` and ``deployments/`` (say a baseline:
    ``git worktree add --detach DIR c8539e5``), in a child interpreter started there."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--json",
                           "--requests", str(requests), "--warmup", str(warmup)],
                          env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"counting {tree} failed:\n{done.stderr[-3000:]}")
    return {name: Measured(**fields) for name, fields in json.loads(done.stdout).items()}


def _unlined(where_: str) -> str:
    """``path:line(name)`` as ``path(name)``: the same function in two trees."""
    path, _, rest = where_.rpartition(":")
    return path + rest[rest.index("("):] if "(" in rest else where_


def growth(before: Measured, after: Measured, top: int = 20) -> list[tuple[str, int, int]]:
    """The functions whose calls per request changed most from ``before`` to ``after``,
    grown first: (function, calls before, calls after)."""
    old: dict[str, int] = collections.Counter()
    new: dict[str, int] = collections.Counter()
    for name, n in before.by_function.items():
        old[_unlined(name)] += n
    for name, n in after.by_function.items():
        new[_unlined(name)] += n
    changed = [(name, old.get(name, 0), new.get(name, 0)) for name in set(old) | set(new)
               if old.get(name, 0) != new.get(name, 0)]
    changed.sort(key=lambda row: (-(row[2] - row[1]), row[0]))
    return changed[:top]


def comparison(before: dict[str, Measured], after: dict[str, Measured], top: int) -> str:
    lines = []
    for name, now in after.items():
        then = before[name]
        lines.append(f"{name}: {then.calls} -> {now.calls} Python calls per request "
                     f"({now.calls - then.calls:+d}), in blitz/ and deployments/ "
                     f"{then.blitz_calls} -> {now.blitz_calls} "
                     f"({now.blitz_calls - then.blitz_calls:+d}), C calls {then.c_calls} -> "
                     f"{now.c_calls} ({now.c_calls - then.c_calls:+d})")
        changed = growth(then, now, 10**6)
        lines.append("  grown most (calls per request, before -> after; a coroutine counts "
                     "once per resumption):")
        lines += [f"  {b:5d} -> {a:5d} ({a - b:+4d})  {fn}" for fn, b, a in changed[:top]
                  if a > b]
        lines.append("  shrunk most:")
        lines += [f"  {b:5d} -> {a:5d} ({a - b:+4d})  {fn}"
                  for fn, b, a in sorted(changed, key=lambda r: r[2] - r[1])[:top] if a < b]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.request_work",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50, help="counted, per profile")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument("--files", action="store_true",
                        help="also list the files of blitz/ and deployments/ a request ran")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="also count the checkout in DIR and show what changed")
    args = parser.parse_args(argv)
    results = run(requests=args.requests, warmup=args.warmup)
    if args.json:
        print(json.dumps({name: as_dict(m) for name, m in results.items()}, indent=1))
        return 0
    for m in results.values():
        print(m.table(args.top))
        print("by area: " + ", ".join(f"{k} {v}" for k, v in sorted(
            m.by_area.items(), key=lambda kv: -kv[1])))
        if args.files:
            print(f"files of blitz/ and deployments/ run: {len(m.files())}\n  "
                  + "\n  ".join(m.files()))
        print()
    if args.against:
        print(f"against {args.against} (before) -> {TREE} (after):\n")
        before = count_tree(args.against, args.requests, args.warmup)
        print(comparison(before, results, args.top))
        for name, m in results.items():
            print(f"{name}: files of blitz/ and deployments/ run "
                  f"{len(before[name].files())} -> {len(m.files())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
