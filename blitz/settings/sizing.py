"""``auto`` sizes: the worker threads and replicas a node's cores and GPUs call for.

A pure policy (no Ray): the app builder hands it the shape of the node Ray gives it
(``NodeShape``: cores and GPUs of the largest node), and ``BlitzSettings`` replaces each
``auto`` it was given (``cpu_pool.workers``, ``gpu_pool.workers``, ``num_replicas`` of the
CPU pool and the ingress) with the number ``size_for`` picks. Why these numbers:

- **2 cores, no GPU** (this project's CI and dev machines): today's measured shape, one
  ingress replica claiming no core, the CPU pool one replica of 2 x 1-thread workers on
  both cores (2 x 1 thread beat 1 x 2 threads: BENCHMARKS.md).
- **HTTP gets cores on bigger nodes**: one ingress replica per 4 cores (one event loop
  carries ~1-2 CPU-ms of HTTP, Serve and msgpack per request, so one loop feeds ~4 cores
  of single-text int8 model calls at ~5 ms each), and each keeps a core out of the
  model cores; HAProxy takes a share of the same.
- **A GPU pool keeps cores for its tokenizing**: two per GPU (its two workers tokenize
  one batch while the GPU runs the other), and the CPU pool leaves them free, so the GPU
  pool's claim always fits beside the CPU pool's, on 2 cores too.
- **The CPU pool**: one 1-thread worker per model core (``torch_threads`` cores each), at
  most ``MAX_WORKERS_PER_REPLICA`` per replica (one event loop and one GIL hand batches
  to them), in as few replicas as that allows: each replica holds its own copy of each
  model, so fewer replicas use less memory.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

AUTO = "auto"
MAX_WORKERS_PER_REPLICA = 8
CORES_PER_INGRESS = 4
MAX_INGRESS_REPLICAS = 16
GPU_POOL_WORKERS = 2  # one tokenizing the next batch while the other's runs on the GPU
CORES_PER_GPU = GPU_POOL_WORKERS


@dataclass(frozen=True)
class NodeShape:
    """What Ray offers on the node the replicas are sized for."""

    cpus: int
    gpus: int = 0

    @classmethod
    def local(cls) -> NodeShape:
        """This machine: the cores this process may run on, no GPU counted (a process
        outside Ray has no GPU resource to claim)."""
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
        return cls(cpus=max(1, cores))


@dataclass(frozen=True)
class Sizing:
    ingress_replicas: int
    cpu_workers: int  # worker threads per CPU pool replica
    cpu_replicas: int
    gpu_workers: int
    model_cores: int  # cores left to the CPU pool's model calls

    def describe(self) -> str:
        return (f"ingress {self.ingress_replicas} replica(s); CPU pool {self.cpu_replicas} "
                f"replica(s) x {self.cpu_workers} worker(s) on {self.model_cores} core(s); "
                f"GPU pool {self.gpu_workers} worker(s) per GPU")


def size_for(node: NodeShape, *, torch_threads: int = 1, gpu_pool: bool = False) -> Sizing:
    """The sizes ``auto`` stands for on ``node`` (module docstring: why)."""
    cpus = max(1, int(node.cpus))
    ingress = min(MAX_INGRESS_REPLICAS, max(1, cpus // CORES_PER_INGRESS))
    http_cores = 0 if cpus <= 2 else ingress
    gpu_cores = CORES_PER_GPU * max(1, int(node.gpus)) if gpu_pool else 0
    model_cores = max(1, cpus - http_cores - gpu_cores)
    workers_total = max(1, model_cores // max(1, torch_threads))
    replicas = math.ceil(workers_total / MAX_WORKERS_PER_REPLICA)
    return Sizing(ingress_replicas=ingress, cpu_workers=workers_total // replicas,
                  cpu_replicas=replicas, gpu_workers=GPU_POOL_WORKERS,
                  model_cores=model_cores)
