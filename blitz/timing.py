"""Where one request's time went, hop by hop: the ``server-timing`` reply header.

Each hop writes what it measured, in seconds, into the ``timings`` of the ``Encoded`` it
hands back (one per job; a job's timings are its batch's):

- the pool replica (``blitz/pool/replica.py``): ``pool``, the whole ``run_jobs`` call;
  ``pool-queue``, waiting in the replica's queue for the model; ``worker-wait``, waiting
  for a worker thread and the hand-off to it; ``model``, the model call on that thread;
- the ingress's dispatcher: ``ingress-queue``, waiting in the ingress's queue for the
  pool; ``call``, the handle call's round trip.

The HTTP middleware adds the request's ``total`` (from reading its headers to starting
the reply) and sends them as ``server-timing`` (W3C Server-Timing, milliseconds), with
three derived entries: ``handle``, the handle hop both ways (Serve's routing,
serialization, transport: ``call - pool``); ``pool-other``, the rest of the replica's
time (the result's way back from the worker thread to the replica's event loop:
``pool - pool-queue - worker-wait - model``); ``ingress``, the ingress's own work (HTTP
parsing, checks, encoding the reply: ``total - ingress-queue - call``), of which ``cache``
is the vector cache's lookups and stores (``ingress.vector_cache_mb``; its ``desc`` says
how many of the request's texts it answered: ``hit 3 of 4``). What the client
measures beyond ``total`` is the HTTP proxy and the network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

HEADER = "server-timing"
ENTRIES = ("total", "ingress", "cache", "ingress-queue", "handle", "pool-queue",
           "worker-wait", "model", "pool-other")  # the header's order: outside in
_START = "start:"  # a mark: an absolute time.perf_counter() in this process, made a duration


def mark(results: Iterable[Any], name: str, at: float) -> None:
    """Stamp each ``Encoded`` in ``results`` with the moment ``name`` began (``at``,
    ``time.perf_counter()``); ``since`` turns it into a duration in the same process."""
    for result in results:
        timings = getattr(result, "timings", None)
        if timings is not None:
            timings[_START + name] = at


def since(results: Iterable[Any], name: str, origin: float) -> None:
    """Turn each result's mark ``name`` into the duration ``name`` from ``origin`` to it."""
    for result in results:
        timings = getattr(result, "timings", None)
        if timings is not None and _START + name in timings:
            timings[name] = max(0.0, timings.pop(_START + name) - origin)


def record(results: Iterable[Any], **durations: float) -> None:
    """Add ``durations`` (seconds; ``_`` in a name is ``-``) to each result's timings."""
    for result in results:
        timings = getattr(result, "timings", None)
        if timings is not None:
            for name, seconds in durations.items():
                timings[name.replace("_", "-")] = seconds


def slowest(parts: Iterable[Any]) -> dict[str, float]:
    """The timings of a request's slowest part (chunks run in parallel, so the request
    waited for that one), marks left out."""
    best: dict[str, float] = {}
    for part in parts:
        timings = getattr(part, "timings", None) or {}
        if timings.get("call", 0.0) + timings.get("ingress-queue", 0.0) >= (
                best.get("call", 0.0) + best.get("ingress-queue", 0.0)):
            best = {k: v for k, v in timings.items() if not k.startswith(_START)}
    return best


def breakdown(timings: Mapping[str, float], total_s: float) -> dict[str, float]:
    """Every entry of the header that ``timings`` allows, in seconds, in header order.
    A derived entry is left out when a part it needs is missing (a local dispatcher
    measures no handle call), and clipped at 0 (clocks of different processes)."""
    out = {"total": total_s, **{k: v for k, v in timings.items() if k in ENTRIES}}
    if "call" in timings:
        out["ingress"] = total_s - timings["call"] - timings.get("ingress-queue", 0.0)
        if "pool" in timings:
            out["handle"] = timings["call"] - timings["pool"]
    if "pool" in timings:
        out["pool-other"] = (timings["pool"] - timings.get("pool-queue", 0.0)
                             - timings.get("worker-wait", 0.0) - timings.get("model", 0.0))
    return {k: max(0.0, out[k]) for k in ENTRIES if k in out}


def header_value(timings: Mapping[str, float], total_s: float,
                 descriptions: Mapping[str, str] | None = None) -> str:
    """The ``server-timing`` value: ``total;dur=4.210, ingress;dur=0.910, ...`` (ms); an
    entry in ``descriptions`` gets its ``desc`` (``cache;dur=0.012;desc="hit 3 of 4"``)."""
    notes = descriptions or {}
    return ", ".join([f"{name};dur={seconds * 1000:.3f}"
                      + (f';desc="{notes[name]}"' if name in notes else "")
                      for name, seconds in breakdown(timings, total_s).items()])


def parse_header(value: str) -> dict[str, float]:
    """A ``server-timing`` value as {name: milliseconds}; entries without ``dur`` are
    left out. For clients, the load test and tests."""
    out: dict[str, float] = {}
    for entry in value.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for param in params:
            key, _, number = param.partition("=")
            if name and key.strip() == "dur":
                try:
                    out[name] = float(number)
                except ValueError:
                    pass
    return out
