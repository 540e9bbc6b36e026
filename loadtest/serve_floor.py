"""The Serve floor: the HTTP floor's app (``loadtest.floor_server``) as a Ray Serve ingress.

What any Serve app pays per request before it does anything of its own: the same raw ASGI
app, the same encoder on one worker thread, none of Blitz's parts, but served as Blitz's
ingress is (one replica, ``@serve.ingress()``, behind Serve's fast path when the config
carries it). Served beside Blitz and the plain floor in one round, it splits what Blitz
adds into Serve's share (this app minus the floor) and Blitz's own (Blitz minus this app);
``loadtest/serving_path.sh`` does that with a model that costs nothing.

    import_path: loadtest.serve_floor:build_app   (args: model, source, backend, threads)
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.deployment import Application

from loadtest.floor_server import blitz_encoder, create_app


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress()
class ServeFloor:
    def __init__(self, model: str, source: str, backend: str, threads: int):
        self.floor = create_app(blitz_encoder(model, source, backend, threads))

    def __serve_build_asgi_app__(self) -> Any:
        return self.floor


def build_app(args: dict[str, Any]) -> Application:
    """``serve run``'s builder: ``args`` as ``loadtest.floor_server``'s options."""
    return ServeFloor.bind(str(args.get("model", "free")), str(args.get("source", "fake:384")),
                           str(args.get("backend", "torch")), int(args.get("threads", 1)))
