"""The batch runner: the Ray glue around ``blitz.batches.runner``.

One replica per app (``batches.deployment``: one replica, no surge, no CPU claimed) moves
every batch in the store along its states, in a thread of its own, every
``batches.poll_s``. A batch's pieces run on the bulk path:

    ray.data.from_items(pieces)                    one block per piece
      -> map(PieceWorker, actor pool, 0 CPUs)      each actor, anywhere in the cluster,
                                                   reads its piece from the store, sends it
                                                   to an ingress (``batch_requests``: each
                                                   line a request at priority low) and
                                                   writes its lines and record
      -> iter_rows on the runner                   each piece counted as it is done; a
                                                   cancel or an expiry stops the stream

A killed actor is restarted by Ray Data and its piece run again (a piece is written whole,
its record last, so it is never counted twice); a runner killed or stopped is started
again by Serve and picks each batch up from the store. Without Ray Data installed (the
serving install leaves the bulk extra out) or with ``batches.engine: threads``, the
runner's own threads send the pieces (``blitz.batches.runner.local_engine``).

On a local store the runner holds ``_runner.lock`` in it while it runs, so two runners
(a redeploy's old one still stopping) never run the same batch at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from ray import serve

from blitz.batches.runner import BatchRunner, Call, Engine, local_engine, run_piece
from blitz.batches.store import Store
from blitz.settings.config import BlitzSettings
from deployments.bind_addresses import keep_replica_grpc_on_node_ip
from deployments.logs import route_library_logs_to_serve
from deployments.model_admin import app_name

logger = logging.getLogger("ray.serve")
LOCK = "_runner.lock"


class LoopThread:
    """An event loop in a thread of its own, for Serve's handles called from threads: in
    Serve's throughput-optimized mode (serve_config.yaml's) a handle runs its router on the
    caller's loop, and a Ray Data actor's or an engine thread's call has none."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="blitz-batch-handles",
                         daemon=True).start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        """``coroutine``'s result, waited for at most ``timeout_s`` (then cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise


def ingress_call(ingress: str, app: str, owner: str, timeout_s: float,
                 loop: LoopThread) -> Call:
    """A piece's requests sent to ingress ``ingress`` of ``app`` as ``owner`` (the handle
    used on ``loop``)."""
    handle = serve.get_deployment_handle(ingress, app)

    async def send(endpoint: str, bodies: list[bytes]) -> list[tuple[int, str, bytes]]:
        return await handle.batch_requests.remote(owner, endpoint, bodies)

    def call(endpoint: str, bodies: list[bytes]) -> list[tuple[int, str, bytes]]:
        return loop.run(send(endpoint, bodies), timeout_s)
    return call


class PieceWorker:
    """``map``'s callable class: one batch's pieces, run from any node."""

    def __init__(self, storage: str, ingress: str, app: str, owner: str,
                 batch: dict[str, Any], max_line_bytes: int, timeout_s: float):
        self.store = Store(storage)
        self.owner, self.batch, self.max_line_bytes = owner, batch, max_line_bytes
        self.call = ingress_call(ingress, app, owner, timeout_s, LoopThread())

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        record = run_piece(self.store, self.owner, self.batch, json.loads(row["piece"]),
                           self.call, self.max_line_bytes)
        return {"done": json.dumps(record)}


def ray_data_engine(storage: str, ingress: str, app: str, concurrency: int,
                    max_line_bytes: int, timeout_s: float) -> Engine:
    def run(owner: str, batch: dict[str, Any], pieces: list[dict[str, int]],
            should_stop: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        import ray.data

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        ds: Any = ray.data.from_items([{"piece": json.dumps(p)} for p in pieces],
                                 override_num_blocks=len(pieces))
        ds = ds.map(PieceWorker, fn_constructor_args=(
            storage, ingress, app, owner, batch, max_line_bytes, timeout_s),
            concurrency=min(concurrency, len(pieces)), num_cpus=0)
        rows = ds.iter_rows()
        try:
            for row in rows:
                yield json.loads(row["done"])
                if should_stop():
                    return
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()  # the stream's executor stops, its actors with it
    return run


def ray_data_installed() -> bool:
    try:
        import ray.data  # noqa: F401
    except ImportError:
        return False
    return True


@serve.deployment
class BatchRunnerDeployment:
    """The app's batch runner (``batches.deployment``)."""

    def __init__(self, settings: dict[str, Any], ingress: str):
        route_library_logs_to_serve()
        keep_replica_grpc_on_node_ip()  # its inter-deployment server where its node is
        self.settings = BlitzSettings.from_args(settings)
        batches = self.settings.batches
        app = app_name()
        self.store = Store(self.settings.batch_storage(app))
        self.store.ensure()
        timeout_s = self.settings.ingress.pool_timeout_s * (batches.line_retries + 2) + 60
        max_line_bytes = self.settings.limits.max_body_bytes
        use_ray_data = batches.engine == "ray_data" or (
            batches.engine == "auto" and ray_data_installed())
        if use_ray_data:
            engine = ray_data_engine(self.store.uri, ingress, app, batches.concurrency,
                                     max_line_bytes, timeout_s)
        else:
            if batches.engine == "auto":
                logger.info("blitz: batches run in the runner's threads (Ray Data is not "
                            "installed: the bulk extra spreads them over the cluster)")
            loop = LoopThread()
            engine = local_engine(self.store, lambda owner: ingress_call(
                ingress, app, owner, timeout_s, loop), batches.concurrency, max_line_bytes)
        self.runner = BatchRunner(self.store, batches, max_line_bytes, engine)
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="blitz-batch-runner",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            with self._lock():
                while not self.stopping.is_set():
                    try:
                        self.runner.tick()
                    except Exception:  # a piece's call failed: its batch goes on next tick
                        logger.exception("blitz: the batch runner's pass failed; next pass "
                                         "in %.1f s", self.settings.batches.poll_s)
                    self.stopping.wait(self.settings.batches.poll_s)
        except BaseException as exc:  # reported by check_health: Serve replaces the replica
            self.failure = exc
            raise

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold the local store's runner lock, waiting for a runner still stopping."""
        if not self.store.local:
            yield
            return
        import fcntl

        with open(os.path.join(self.store.root, LOCK), "a") as handle:
            while not self.stopping.is_set():
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    self.stopping.wait(self.settings.batches.poll_s)
            yield  # stopping while it waited: the loop ends at once

    async def pid(self) -> int:
        """This replica's process id (the fault tests kill it)."""
        return os.getpid()

    async def check_health(self) -> None:
        if self.failure is not None or not self.thread.is_alive():
            raise RuntimeError(f"the batch runner's thread stopped ({self.failure!r})")

    def __del__(self) -> None:
        stopping = getattr(self, "stopping", None)
        if stopping is not None:
            stopping.set()
