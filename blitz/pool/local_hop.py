"""The local hop: an ingress calls a pool replica on its own node over a Unix socket.

Serve's handle hop (router, request metadata, gRPC, Serve's replica wrappers) costs
milliseconds of one user's latency and CPU per call (BENCHMARKS.md, "Entry points").
When a pool runs one fixed replica on the ingress's node, the ingress sends the
same ``run_jobs`` call down a socket instead: one frame out, one frame back.

- **Frames**: a 4-byte big-endian length, then a pickle (protocol 5) of
  ``("call", call_id, model_id, jobs)``, ``("cancel", call_id)`` or, back,
  ``(call_id, results | exception)``. Jobs and results are the objects that cross
  Serve's hop (it pickles them too); no stranger can reach the socket: it lives in a
  directory of its own, mode 700, and is mode 600 itself (the same user's processes
  only), and a frame over ``MAX_FRAME`` closes the connection.
- **Nothing hangs on a lost peer**: a client whose connection ends or breaks fails every
  call waiting on it with ``HopLost`` (the ingress then takes Serve's handle, as it does
  for a replica that died), and calls after that fail at once; a caller that gives up
  sends a cancel, and the server cancels that call's task; a server whose client went
  away cancels that connection's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import pickle
import shutil
import struct
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

logger = logging.getLogger("blitz.local_hop")
HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a batch of results is a few MiB; more is a broken peer
SOCKET_NAME = "pool.sock"

Handler = Callable[[str, Any], Awaitable[Any]]


class HopLost(ConnectionError):
    """The socket to the pool replica broke: take Serve's handle instead."""


def _frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=5)
    return HEADER.pack(len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise HopLost(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return pickle.loads(await reader.readexactly(size))


def _sendable(error: BaseException) -> BaseException:
    """``error`` if it pickles (Blitz's errors do), else a RuntimeError naming its type."""
    try:
        pickle.dumps(error, protocol=5)
        return error
    except Exception:  # noqa: BLE001 - any unpicklable error is replaced, never lost
        return RuntimeError(f"pool call failed: {type(error).__name__}")


def _forget(calls: dict[int, asyncio.Task], call_id: int, _task: asyncio.Task) -> None:
    calls.pop(call_id, None)


class LocalHopServer:
    """Serves ``handler(model_id, jobs)`` on a Unix socket in a directory it makes (and
    removes on ``close``)."""

    def __init__(self, handler: Handler):
        self._handler = handler
        self._directory = tempfile.mkdtemp(prefix="blitz-hop-")  # mode 700
        self.path = os.path.join(self._directory, SOCKET_NAME)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._in_flight: set[asyncio.Task] = set()  # calls being answered, every connection
        self.calls = 0  # calls answered or failed, for stats

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)  # its folder (mode 700) already keeps others out

    def close(self) -> None:
        """Stop listening, end every connection (its client's calls fail with ``HopLost``)
        and remove the socket's folder (made by ``__init__``); idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._connections):
            writer.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def drain(self, timeout_s: float) -> bool:
        """Stop taking connections, wait (at most ``timeout_s``) until every call being
        answered has its answer written, then ``close``. The replica's stop waits on this:
        Serve counts only its own requests, and would stop the replica with these calls
        in it. Whether every call was answered."""
        if self._server is not None:
            self._server.close()  # new connections refused; open ones finish their calls
        pending = set(self._in_flight)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout_s)
        self.close()
        return not pending

    def stop(self, drain_s: float) -> Coroutine[Any, Any, None] | None:
        """At the replica's stop: ``close`` now, or with calls in flight and a loop
        running, a coroutine that answers them first (``drain``, within ``drain_s``)."""
        if self.in_flight:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # Python's own call, off any loop: nothing can be awaited
                pass
            else:
                return self._stop_draining(drain_s)
        self.close()
        return None

    async def _stop_draining(self, drain_s: float) -> None:
        logger.info("stopping: answering %d call(s) the local hop holds first", self.in_flight)
        if not await self.drain(drain_s):
            logger.warning("stopping: local hop calls still unanswered after %.0f s", drain_s)

    async def aclose(self) -> None:
        """``close``, then wait until every connection's socket is closed."""
        writers = list(self._connections)
        self.close()
        for writer in writers:
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        calls: dict[int, asyncio.Task] = {}
        self._connections.add(writer)
        try:
            while True:
                message = await _read_frame(reader)
                if message[0] == "cancel":
                    task = calls.get(message[1])
                    if task is not None:
                        task.cancel()
                    continue
                _, call_id, model_id, jobs = message
                task = asyncio.ensure_future(self._answer(writer, call_id, model_id, jobs))
                calls[call_id] = task
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
                task.add_done_callback(functools.partial(_forget, calls, call_id))
        except (asyncio.IncompleteReadError, ConnectionError, HopLost, pickle.PickleError):
            pass  # the client went away (or broke the protocol): its calls go with it
        finally:
            for task in list(calls.values()):
                task.cancel()
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, call_id: int, model_id: str,
                      jobs: Any) -> None:
        self.calls += 1
        try:
            result: Any = await self._handler(model_id, jobs)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, as Serve does
            result = _sendable(exc)
        try:
            writer.write(_frame((call_id, result)))
        except Exception as exc:  # noqa: BLE001 - an unpicklable result fails its call only
            writer.write(_frame((call_id, _sendable(RuntimeError(
                f"pool call result could not be sent: {type(exc).__name__}")))))


class LocalHopClient:
    """One connection to a ``LocalHopServer``; calls share it, each awaits its own frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._lost: HopLost | None = None
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, path: str) -> LocalHopClient:
        reader, writer = await asyncio.open_unix_connection(path)
        return cls(reader, writer)

    @property
    def lost(self) -> bool:
        return self._lost is not None

    async def call(self, model_id: str, jobs: Any) -> Any:
        """The pool's ``run_jobs_for(model_id, jobs)``; raises what it raised, or
        ``HopLost``. Cancelling the caller cancels the call on the pool."""
        if self._lost is not None:
            raise self._lost
        call_id = next(self._ids)
        frame = _frame(("call", call_id, model_id, jobs))
        future = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            try:
                self._writer.write(frame)
            except Exception as exc:  # closed under us before the reader saw it: lost too
                del self._waiting[call_id]  # this call fails here, not through its future
                lost = HopLost(f"the local hop to the pool broke ({type(exc).__name__})")
                self._fail(lost)
                raise lost from exc
            result = await future
        except asyncio.CancelledError:
            if self._lost is None:
                with contextlib.suppress(Exception):
                    self._writer.write(_frame(("cancel", call_id)))
            raise
        finally:
            self._waiting.pop(call_id, None)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _read(self) -> None:
        try:
            while True:
                call_id, result = await _read_frame(self._reader)
                future = self._waiting.get(call_id)
                if future is not None and not future.done():
                    future.set_result(result)
        except asyncio.CancelledError:
            self._fail(HopLost("the local hop was closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - EOF, reset, a broken frame: all lost
            self._fail(HopLost(f"the local hop to the pool broke ({type(exc).__name__})"))

    def _fail(self, error: HopLost) -> None:
        self._lost = error
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._writer.close()

    def close(self) -> None:
        """End the connection; calls still waiting fail with ``HopLost``."""
        if self._lost is None:
            self._fail(HopLost("the local hop was closed"))
        self._reading.cancel()
