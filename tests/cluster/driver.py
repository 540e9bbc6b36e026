"""A two-node Ray cluster on this machine, with Blitz deployed on it, driven over stdin.

Run by tests/cluster/test_multi_node.py in its own process (one ``ray.init`` per process:
the test session's shared Ray cannot be reused), with ``RAY_TMPDIR`` set to a private
directory so that this cluster's address never lands in ``/tmp/ray/ray_current_cluster``
where another process's ``ray.init()`` would find it.

    python -m tests.cluster.driver '{"http_port": 8123, "app": {...serve_config args...}}'

- head node: CPUs and the custom resource ``head`` (the ingress and the CPU pool ask for
  it, so they live here); the Serve controller and the HTTP proxy (HeadOnly) run here too.
- worker node: one CPU and one *logical* GPU: ``gpu: auto`` binds the GPU pool, and Ray
  can place it only here (where it finds no CUDA and falls back to CPU).

It prints one line per event, ``BLITZ-CLUSTER {json}``: ``ready`` (URL, node ids, where
each pool's replica runs), then, on the command ``remove``, ``removed`` (the worker node
is killed outright, as a lost machine would be). On ``stop`` or end of input it shuts
Serve, the driver and both nodes down and exits.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

PREFIX = "BLITZ-CLUSTER "
HEAD_RESOURCE = "head"


def emit(event: str, **fields: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **fields}), flush=True)


def pool_stats(name: str) -> dict:
    from ray import serve

    return serve.get_deployment_handle(name, app_name="blitz").stats.remote().result()


def wait_until_alive(count: int, timeout_s: float = 60) -> int:
    """The number of live nodes once it is ``count`` (Ray's GCS notices a killed node
    within seconds), or after ``timeout_s``."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        alive = sum(node["Alive"] for node in ray.nodes())
        if alive == count or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def main() -> None:
    spec = json.loads(sys.argv[1])
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from deployments.app import build_app

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {HEAD_RESOURCE: 100}, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        serve.start(proxy_location="HeadOnly",
                    http_options={"host": "127.0.0.1", "port": spec["http_port"]})
        serve.run(build_app(spec["app"]), name="blitz", route_prefix="/")
        emit("ready", url=f"http://127.0.0.1:{spec['http_port']}",
             head=cluster.head_node.node_id, worker=worker.node_id,
             cluster_gpus=ray.cluster_resources().get("GPU", 0),
             cpu_pool=pool_stats("CPUPool"), gpu_pool=pool_stats("GPUPool"))
        for line in sys.stdin:
            command = line.strip()
            if command == "remove":
                cluster.remove_node(worker, allow_graceful=False)
                emit("removed", alive_nodes=wait_until_alive(1))
            elif command == "stop":
                break
        serve.shutdown()
        ray.shutdown()
    finally:
        cluster.shutdown()
    emit("stopped")


if __name__ == "__main__":
    main()
