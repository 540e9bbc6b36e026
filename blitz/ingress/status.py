"""What the ingress says about itself: readiness (``/ready``), the registry (``/models``)
and the server's facts (``/info``, Hugging Face TEI's fields where they apply), answered
from state the ingress holds, with no pool call."""

from __future__ import annotations

import logging
import time
from importlib import metadata
from typing import TYPE_CHECKING

from blitz.errors import NotReady
from blitz.loading.facts import model_shape, read_dimension, read_facts
from blitz.pool.memory_budget import size_model
from blitz.settings.kinds import kind_of

if TYPE_CHECKING:
    from blitz.ingress.service import EmbeddingService, RequestRecord

logger = logging.getLogger("blitz.service")


def check_ready(service: EmbeddingService) -> dict[str, object]:
    """Raise ``NotReady`` unless the default model can be served now; else the facts.

    Answered from state this process already has, with no call and no wait, so a probe
    that gives up after half a second still gets its answer, no probe can leave a
    check half done, and readiness neither loads a model nor queues behind traffic:

    - the CPU pool has a running replica (Serve starts routing to a replica only once
      its constructor, the ``preload`` included, has finished), unless it may scale
      to zero (``min_replicas: 0`` in ``cpu_pool.deployment.autoscaling_config``);
    - the default model has not failed to load within the pool's
      ``load_failure_ttl_s`` (the last request for it answered 424; a later 200
      clears it).

    The cause of a failure goes to the log; the client reads only that the default
    model is not ready, unless the cause is the operator's to fix: a CPU pool replica
    the cluster cannot place (``unplaced``, also listed when ready for other pools).
    """
    default = service.settings.default_model
    cpu = service.settings.cpu_pool
    running = service.dispatcher.running_pools()
    problem = None
    unplaced = service.dispatcher.unplaced_pools()
    if "cpu" not in running and cpu.min_replicas > 0:
        problem = "the CPU pool has no running replica yet"
        if "cpu" in unplaced:  # the operator's to fix: the probe says so
            raise NotReady(f"default model {default!r} is not ready: {unplaced['cpu']}")
    elif (service.default_failed_at is not None
          and time.monotonic() - service.default_failed_at < cpu.load_failure_ttl_s):
        problem = f"the default model {default!r} failed to load"
    if problem is not None:
        if problem != service.not_ready_logged:
            logger.warning("readiness: %s", problem)
        service.not_ready_logged = problem
        raise NotReady(f"default model {default!r} is not ready; retry shortly")
    service.not_ready_logged = None
    return {"status": "ready", "default_model": default, "pools": sorted(running),
            **({"unplaced": dict(unplaced)} if unplaced else {})}


def bare_ready(service: EmbeddingService, record: RequestRecord,
               ) -> tuple[dict[str, object], int, dict[str, str]]:
    """``/ready`` for a caller without a valid key while API keys are on: the body, status
    code and headers of ``check_ready``'s answer with its status alone (no model ids,
    pools or what the cluster has free: a key holder's to read)."""
    try:
        check_ready(service)
    except NotReady as exc:
        record.error = exc.code
        retry = {} if exc.retry_after_s is None else {"retry-after": str(exc.retry_after_s)}
        return {"status": exc.code}, exc.status, retry
    return {"status": "ready"}, 200, {}


def describe_models(service: EmbeddingService, sources: bool = False) -> list[dict]:
    """The registry as ``GET /models`` shows it; each model's ``source`` (bucket URIs,
    paths: for operators) only when ``sources``; ``unplaced``: pools whose replica the
    cluster cannot place, and why."""
    unplaced = service.dispatcher.unplaced_pools()
    return [
        {"id": s.id, "kind": s.kind, "dimension": read_dimension(s),
         "max_seq_length": s.max_seq_length,
         **({"source": s.source} if sources else {}),
         "cpu_backend": s.cpu_backend, "gpu_dtype": s.gpu_dtype,
         "default": s.id == service.settings.default_model,
         "pools": sorted(service.dispatcher.pools),
         **({"unplaced": dict(unplaced)} if unplaced else {})}
        for s in service.registry
    ]


def version() -> str:
    try:
        return metadata.version("blitz")
    except metadata.PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


def info(service: EmbeddingService, model: str | None = None) -> dict[str, object]:
    """``GET /info``: Hugging Face TEI's fields for one model (the default, or ``model``),
    so that TEI's clients read it unchanged, then Blitz's own: every model and each
    pool's limits. Answered from the settings and the model files' config, no pool call."""
    settings, limits = service.settings, service.settings.limits
    spec = service.spec(model)
    pools = sorted(service.dispatcher.pools)
    batch = {pool: service.dispatcher.max_batch(pool) for pool in pools}
    shape = model_shape(spec)
    tokens = {pool: size_model(spec, settings.pool(pool), "cuda" if pool == "gpu" else "cpu",
                               settings.pool(pool).memory_bytes, shape).max_batch_tokens
              for pool in pools}  # a budget left to a GPU's memory lowers it there only
    facts = read_facts(spec)
    row = kind_of(spec.kind)
    kind: dict[str, object] = {"reranker": {}}
    if row.model_type == "classifier":
        found = facts.get("id2label")
        id2label: dict[str, str] = found if isinstance(found, dict) else {}
        kind = {"classifier": {"id2label": id2label,
                               "label2id": {v: int(k) for k, v in id2label.items()}}}
    elif row.model_type == "embedding":  # the kind's pooling, else the model files'
        kind = {"embedding": {"pooling": row.pooling or facts["pooling"]}}
    return {
        "model_id": spec.id,
        "model_sha": None,
        "model_dtype": "float32" if spec.cpu_backend != "onnx-int8" else "int8",
        "served_model_name": spec.id,
        "model_type": kind,
        "max_concurrent_requests": settings.ingress.max_queued_texts,
        "max_input_length": facts["max_input_length"],
        "max_batch_tokens": tokens.get("gpu", tokens.get("cpu")),  # where long batches go
        "max_batch_requests": max(batch.values(), default=None),
        "max_client_batch_size": limits.max_texts_per_request,
        "auto_truncate": True,
        "tokenization_workers": None,
        "version": version(),
        "sha": None,
        "docker_label": None,
        # Blitz's own
        "default_model": settings.default_model,
        "models": describe_models(service),
        "pools": {pool: {"max_batch_size": batch[pool], "max_batch_tokens": tokens[pool]}
                  for pool in pools},
        "limits": limits.model_dump(),
    }
