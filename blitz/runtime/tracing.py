"""OpenTelemetry traces: one request followed across the ingress and the pool replica.

Off by default. On in a process once ``configure`` finds an OTLP endpoint
(``tracing.otlp_endpoint``, else ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``$OTEL_EXPORTER_OTLP_ENDPOINT``; ``$OTEL_SDK_DISABLED=true`` keeps it off); spans go out
over OTLP/HTTP from a background thread (the ``tracing`` extra). While off, nothing here
imports opentelemetry, ``TRACER`` is None, and the request path pays one ``is None`` test
per hop and nothing else.

One request's spans, each made from the times the hops already measure for
``server-timing`` (``blitz.timing``), so tracing adds no clock reads of its own:

    POST /embed            SERVER  the ingress: the HTTP request (gRPC: tei.v1.Embed/Embed),
                                   a child of the caller's W3C ``traceparent``, if it sent one
      blitz.ingress_queue          waiting in the ingress's queue for a pool call
      blitz.hop            CLIENT  the pool call, there and back (Serve's handle, the local
                                   hop, or the pool in the ingress's own process)
        blitz.pool         SERVER  in the pool replica's process: the job, arrival to answer
          blitz.pool_queue         waiting in the replica's queue for the model
          blitz.batch              the batch the job ran in: a worker thread, then the model
            blitz.model            the model call on the worker thread

A request cut into jobs (the pool's batch limit) has a queue and a hop span per job. A pool
call and a pool batch serve many requests at once: every job still gets its own hop, pool,
batch and model spans, children of its own request's, so each trace is whole; the batch
span says how large the batch was (``blitz.batch.jobs``, ``blitz.batch.texts``) and links
to the pool spans of the other jobs in it (``MAX_LINKS`` at most). The context crosses
from ingress to pool inside each job (the ``trace`` field of ``blitz.hop_messages``' jobs:
a traceparent, then the tracestate after a newline), so it travels over Serve's handle and
the local hop alike. Requests the sampler leaves out get no spans and send no context on.
Which are traced is this server's choice: ``tracing.sample_ratio`` of them, those that bring
a ``traceparent`` too, whatever its sampled flag says (a stranger cannot have every request
traced, nor none); ``tracing.trust_remote_sampling`` makes a caller's flag decide instead.
The fronts start a request's span only once its API key has passed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

logger = logging.getLogger("blitz.tracing")

TRACER: Any = None
"""The OpenTelemetry tracer while tracing is on in this process; None while it is off."""
MAX_LINKS = 32  # a batch span's links to the other jobs of its batch
ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
INSTALL = "pip install 'blitz[tracing]' (bash scripts/install.sh tracing)"

_otel: Any = None  # what the spans below use of opentelemetry, bound by ``install``
_sample_ratio = 1.0  # tracing.sample_ratio, for requests that bring a traceparent
_trust_remote_sampling = False  # tracing.trust_remote_sampling
J = TypeVar("J")
PoolCall = Callable[[list[J]], Awaitable[list[Any]]]


def endpoint_of(configured: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where traces go: ``configured``, else the environment's OTLP endpoint; None: off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    return configured or next((environ[k] for k in ENDPOINT_ENVS if environ.get(k)), None)


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP base URL (``http://collector:4318``) as its traces URL."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


class Settings(Protocol):
    """What ``configure`` reads: ``blitz.settings.config.TracingSettings``."""

    otlp_endpoint: str | None
    service_name: str
    sample_ratio: float
    trust_remote_sampling: bool


def configure(settings: Settings) -> bool:
    """Turn tracing on in this process when an endpoint is configured (``endpoint_of``);
    once per process: a later call keeps what the first one did. Whether it is on."""
    if TRACER is not None:
        return True
    otlp_endpoint, sample_ratio = settings.otlp_endpoint, settings.sample_ratio
    endpoint = endpoint_of(otlp_endpoint)
    if endpoint is None:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        if otlp_endpoint:  # asked for in the settings: say so at once
            raise RuntimeError("tracing.otlp_endpoint is set, but OpenTelemetry's OTLP "
                               f"exporter is not installed: {INSTALL}") from exc
        logger.warning("an OTLP endpoint is set in the environment, but OpenTelemetry's OTLP "
                       "exporter is not installed (%s): no traces", INSTALL)
        return False
    named = ({} if os.environ.get("OTEL_SERVICE_NAME") else
             {"service.name": settings.service_name})
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
                              resource=Resource.create({**named, "process.pid": os.getpid()}))
    exporter = OTLPSpanExporter(endpoint=traces_url(otlp_endpoint) if otlp_endpoint else None)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider, sample_ratio, settings.trust_remote_sampling)
    logger.info("traces on: OTLP/HTTP to %s, sample ratio %g%s", endpoint, sample_ratio,
                ", callers' sampled flags followed" if settings.trust_remote_sampling else "")
    return True


def install(provider: Any, sample_ratio: float = 1.0,
            trust_remote_sampling: bool = False) -> None:
    """Trace through ``provider`` (an SDK ``TracerProvider``) from now on: ``configure``'s
    way in, and tests' (with an in-memory exporter). ``sample_ratio`` and
    ``trust_remote_sampling`` decide for requests that bring a ``traceparent``
    (``start_request``); the provider's sampler for the rest."""
    global TRACER, _otel, _sample_ratio, _trust_remote_sampling
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    class Otel:
        kinds = trace.SpanKind
        link = trace.Link
        status = trace.Status
        error = trace.StatusCode.ERROR
        in_context = staticmethod(trace.set_span_in_context)
        span_of = staticmethod(trace.get_current_span)
        propagator = TraceContextTextMapPropagator()
        remote_parent = staticmethod(lambda parent: trace.NonRecordingSpan(trace.SpanContext(
            parent.trace_id, parent.span_id, is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            trace_state=parent.trace_state)))

    _otel = Otel
    _sample_ratio, _trust_remote_sampling = sample_ratio, trust_remote_sampling
    TRACER = provider.get_tracer("blitz")


def uninstall() -> None:
    """Tracing off again in this process (tests); the provider stays its owner's."""
    global TRACER
    TRACER = None


# ---- the ingress's request span -------------------------------------------------------

class RequestSpan:
    """One request's span at the ingress (SERVER), and the context its jobs carry on."""

    __slots__ = ("span", "carrier")

    def __init__(self, span: Any):
        self.span = span
        self.carrier = _carrier_of(span)

    def stamp(self, job: J) -> J:
        """``job`` carrying this request's context to the pool (its ``trace``)."""
        return dataclasses.replace(job, trace=self.carrier)  # type: ignore[type-var]

    def stamping(self, make_job: Callable[..., J]) -> Callable[..., J]:
        """``make_job`` whose jobs are ``stamp``\\ ed."""
        return lambda *args: self.stamp(make_job(*args))

    def end(self, record: Any, failed: bool, attributes: Mapping[str, Any]) -> None:
        """End the span with ``attributes`` and what ``record`` (the request's
        ``RequestRecord``) learnt; an error span when ``failed``."""
        span = self.span
        span.set_attributes(attributes)
        span.set_attributes({"blitz.model": record.model, "blitz.pool": record.pool,
                             "blitz.texts": record.texts, "blitz.tokens": record.tokens})
        if record.error:
            span.set_attribute("error.type", record.error)
        if failed:
            span.set_status(_otel.status(_otel.error, record.error or None))
        span.end()


def start_request(name: str, carrier: Any, attributes: Mapping[str, Any]) -> RequestSpan | None:
    """The span of a request coming in (SERVER), a child of the W3C ``traceparent`` (and
    ``tracestate``) in ``carrier`` (HTTP headers, gRPC metadata: anything with ``get``)
    when it holds a valid one, else the root of a trace; None when it is not sampled
    (``sampled_here``)."""
    context = _otel.propagator.extract(carrier)
    if not _trust_remote_sampling:
        context = sampled_here(context, _sample_ratio)
        if context is None:
            return None
    span = TRACER.start_span(name, context, kind=_otel.kinds.SERVER, attributes=attributes)
    if not span.is_recording():
        return None
    return RequestSpan(span)


def sampled_here(context: Any, ratio: float, draw: Callable[[], float] = random.random
                 ) -> Any:
    """A caller's ``context`` (its traceparent, extracted) with this server's decision in
    place of the caller's sampled flag: None (not traced) unless a ``draw`` in [0, 1) falls
    under ``ratio``, else the same parent marked sampled, so the provider's sampler
    (parent-based) keeps it. A draw, not the trace id: the caller chooses that. A context
    without a valid parent is returned as it is: a trace begun here, the sampler's."""
    parent = _otel.span_of(context).get_span_context()
    if not parent.is_valid:
        return context
    if draw() >= ratio:
        return None
    return context if parent.trace_flags.sampled else _otel.in_context(
        _otel.remote_parent(parent), context)


def waited(trace: str, name: str, entered: float, seconds: float,
           attributes: Mapping[str, Any] | None = None) -> None:
    """A span ``name`` under ``trace`` (a job's context) from ``entered``
    (``time.perf_counter()``) for ``seconds``: a queue's wait, measured by its hop."""
    _made(name, _context(trace), _clock(), entered, entered + seconds, attributes)


# ---- the hop and the pool replica -----------------------------------------------------

def hops(call: PoolCall, pool: str, model_id: str) -> PoolCall:
    """``call`` (one pool call for a batch of jobs) with a CLIENT span per traced job, each
    a child of its job's context, which the job carries on instead."""
    attributes = {"blitz.pool": pool, "blitz.model": model_id}

    async def traced(jobs: list[J]) -> list[Any]:
        return await _under(call, jobs, "blitz.hop", _otel.kinds.CLIENT,
                            {**attributes, "blitz.hop.jobs": len(jobs)})

    return traced


async def in_pool(run: PoolCall, jobs: list[J], pool: str, model_id: str) -> list[Any]:
    """``run(jobs)`` (a pool replica's queue and batches) with a SERVER span per traced job,
    a child of its hop's, and under it the job's ``pool-queue`` wait from its timings."""
    entered = time.perf_counter()
    spans: list[Any] = []
    results = await _under(run, jobs, "blitz.pool", _otel.kinds.SERVER,
                           {"blitz.pool": pool, "blitz.model": model_id}, spans)
    clock = _clock()
    for span, result in zip(spans, results, strict=True):
        queued = (getattr(result, "timings", None) or {}).get("pool-queue")
        if span is not None and queued is not None:
            _made("blitz.pool_queue", _otel.in_context(span), clock, entered, entered + queued)
    return results


def batch(jobs: Sequence[Any], results: Sequence[Any], started: float, model_at: float,
          model_s: float, attributes: Mapping[str, Any]) -> None:
    """The ``blitz.batch`` span (``started`` to now) and its ``blitz.model`` span
    (``model_at``, ``model_s`` long) of each traced job of one pool batch, every job's
    under its own context; times are ``time.perf_counter()``."""
    traced = [(k, _context(job.trace)) for k, job in enumerate(jobs)
              if getattr(job, "trace", None)]
    if not traced:
        return
    clock, ended = _clock(), time.perf_counter()
    peers = [_otel.span_of(context).get_span_context() for _, context in traced]
    for i, (k, context) in enumerate(traced):
        links = [_otel.link(peer) for j, peer in enumerate(peers) if j != i][:MAX_LINKS]
        error = results[k] if isinstance(results[k], BaseException) else None
        span = _made("blitz.batch", context, clock, started, ended, attributes, links)
        _made("blitz.model", _otel.in_context(span), clock, model_at, model_at + model_s,
              error=error)


# ---- the parts --------------------------------------------------------------------------

async def _under(call: PoolCall, jobs: list[J], name: str, kind: Any,
                 attributes: Mapping[str, Any], spans: list[Any] | None = None) -> list[Any]:
    """``call(jobs)`` with a live span ``name`` per traced job (a child of the job's
    context, which the job then carries instead), ended with the job's result; the spans
    go into ``spans`` (None for an untraced job), still usable as parents."""
    made = [] if spans is None else spans
    sent: list[J] = []
    for job in jobs:
        trace = getattr(job, "trace", None)
        span = None if trace is None else TRACER.start_span(
            name, _context(trace), kind=kind, attributes=attributes)
        made.append(span)
        sent.append(job if span is None else dataclasses.replace(  # type: ignore[type-var]
            job, trace=_carrier_of(span)))
    try:
        results = await call(sent)
    except BaseException as exc:
        for span in made:
            if span is not None:
                _end(span, exc)
        raise
    for span, result in zip(made, results, strict=True):
        if span is not None:
            _end(span, result if isinstance(result, BaseException) else None)
    return results


def _made(name: str, parent: Any, clock: int, start: float, end: float,
          attributes: Mapping[str, Any] | None = None, links: Sequence[Any] = (),
          error: BaseException | None = None) -> Any:
    """A span already over: from ``start`` to ``end`` (``time.perf_counter()``, placed on
    the wall clock by ``clock``, ``_clock()``), under ``parent`` (a context)."""
    span = TRACER.start_span(name, parent, attributes=attributes, links=links,
                             start_time=clock + int(start * 1e9))
    _end(span, error, clock + int(end * 1e9))
    return span


def _end(span: Any, error: BaseException | None, at: int | None = None) -> None:
    if error is not None:
        code = getattr(error, "code", None)
        kind = code if isinstance(code, str) else type(error).__name__
        span.set_attribute("error.type", kind)  # the kind only: messages may quote inputs
        span.set_status(_otel.status(_otel.error, kind))
    span.end(end_time=at)


def _clock() -> int:
    """Nanoseconds to add to ``time.perf_counter()`` seconds * 1e9 for the wall clock."""
    return time.time_ns() - int(time.perf_counter() * 1e9)


def _carrier_of(span: Any) -> str:
    """``span``'s context as a job carries it: traceparent, then a newline and the
    tracestate when there is one."""
    context = span.get_span_context()
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    return f"{parent}\n{state}" if state else parent


def _context(trace: str) -> Any:
    """The context a job carries (``_carrier_of``), to start its spans under."""
    parent, _, state = trace.partition("\n")
    return _otel.propagator.extract({"traceparent": parent, "tracestate": state} if state
                                    else {"traceparent": parent})
