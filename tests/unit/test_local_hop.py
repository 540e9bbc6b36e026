"""blitz.pool.local_hop: pool calls over a Unix socket, and what a lost peer or a caller that
gives up leaves behind (nothing hangs, nothing stays)."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from blitz.errors import UnknownModel
from blitz.pool.local_hop import HopLost, LocalHopClient, LocalHopServer

BOUND_S = 10  # a bound on each wait below, not a timing assertion


class Pool:
    """A pool's ``run_jobs_for`` stand-in: echoes, fails, or blocks until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled: list[str] = []

    async def run_jobs_for(self, model_id: str, jobs: list) -> list:
        if model_id == "unknown":
            raise UnknownModel("no model 'unknown'")
        if model_id == "slow":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(model_id)
                raise
        if model_id == "unpicklable":
            return [lambda: None]
        return [(model_id, job) for job in jobs]


async def _pair(pool: Pool) -> tuple[LocalHopServer, LocalHopClient]:
    server = LocalHopServer(pool.run_jobs_for)
    await server.start()
    return server, await LocalHopClient.connect(server.path)


async def _until(condition, what: str) -> None:
    async with asyncio.timeout(BOUND_S):
        while not condition():
            await asyncio.sleep(0.01)


async def test_calls_come_back_each_with_its_own_results():
    server, client = await _pair(Pool())
    try:
        answers = await asyncio.gather(*(client.call(f"m{i}", [i, i + 1]) for i in range(20)))
        assert answers == [[(f"m{i}", i), (f"m{i}", i + 1)] for i in range(20)]
        assert server.calls == 20
    finally:
        client.close()
        await server.aclose()


async def test_errors_cross_the_hop_as_themselves_and_fail_their_call_only():
    server, client = await _pair(Pool())
    try:
        with pytest.raises(UnknownModel, match="no model 'unknown'"):
            await client.call("unknown", [1])
        with pytest.raises(RuntimeError, match="could not be sent"):
            await client.call("unpicklable", [1])
        assert await client.call("m", [1]) == [("m", 1)]  # the connection lives on
    finally:
        client.close()
        await server.aclose()


async def test_the_socket_is_the_same_users_only_and_goes_on_close():
    server, client = await _pair(Pool())
    folder = os.path.dirname(server.path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert await client.call("m", [1]) == [("m", 1)]
    client.close()
    await server.aclose()
    server.close()  # idempotent
    assert not os.path.exists(folder)


async def test_a_caller_that_gives_up_cancels_its_call_on_the_pool():
    pool = Pool()
    server, client = await _pair(pool)
    try:
        call = asyncio.ensure_future(client.call("slow", [1]))
        await _until(lambda: server.calls == 1, "the call to reach the pool")
        call.cancel()
        await _until(lambda: pool.cancelled == ["slow"], "the pool's task to be cancelled")
        assert await client.call("m", [2]) == [("m", 2)]
    finally:
        client.close()
        await server.aclose()


async def test_a_pool_that_goes_away_fails_waiting_and_later_calls_at_once():
    pool = Pool()
    server, client = await _pair(pool)
    waiting = asyncio.ensure_future(client.call("slow", [1]))
    await _until(lambda: server.calls == 1, "the call to reach the pool")
    await server.aclose()  # as a replica that dies: its connections close
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(HopLost):
            await waiting
    assert client.lost
    with pytest.raises(HopLost):
        await client.call("m", [1])
    client.close()


async def test_a_stopping_pool_answers_the_calls_it_holds_before_it_closes():
    """Serve's drain counts only Serve's requests: the replica's stop drains the hop
    itself, refusing new connections and answering every call it holds, then closes."""
    pool = Pool()
    server, client = await _pair(pool)
    held = asyncio.ensure_future(client.call("slow", [1]))
    await _until(lambda: server.in_flight == 1, "the call to reach the pool")
    draining = asyncio.ensure_future(server.drain(BOUND_S))
    await asyncio.sleep(0)
    with pytest.raises(OSError):
        await LocalHopClient.connect(server.path)  # no new connection while it stops
    assert not held.done()
    pool.release.set()
    async with asyncio.timeout(BOUND_S):
        assert await held == [("slow", 1)]
        assert await draining is True
    assert server.in_flight == 0 and not os.path.exists(server.path)
    client.close()


async def test_a_drain_that_runs_out_of_time_still_closes_and_says_so():
    server, client = await _pair(Pool())
    held = asyncio.ensure_future(client.call("slow", [1]))
    await _until(lambda: server.in_flight == 1, "the call to reach the pool")
    assert await server.drain(0.01) is False
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(HopLost):
            await held
    client.close()


class ClosedWriter:
    """A stream writer whose transport closed before the reader saw the end (uvloop then
    raises RuntimeError from ``write``)."""

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <UnixTransport closed=True>")

    def close(self) -> None:
        pass


async def test_a_socket_closed_before_the_reader_saw_it_is_a_lost_hop_not_a_500():
    """A redeploy closes the pool's socket; the next call's write raises RuntimeError,
    which must be a lost hop (retried over the handle), not a 500 to the client."""
    pool = Pool()
    server, client = await _pair(pool)
    real, client._writer = client._writer, ClosedWriter()  # type: ignore[assignment]
    with pytest.raises(HopLost):
        await client.call("m", [1])
    assert client.lost
    client.close()
    real.close()
    await real.wait_closed()
    await _until(lambda: not server._connections, "the pool to see the socket close")
    await server.aclose()


async def test_a_client_that_goes_away_cancels_its_calls_on_the_pool():
    pool = Pool()
    server, client = await _pair(pool)
    try:
        call = asyncio.ensure_future(client.call("slow", [1]))
        await _until(lambda: server.calls == 1, "the call to reach the pool")
        client.close()  # as an ingress replica that dies: its socket closes
        with pytest.raises(HopLost):
            await call
        await _until(lambda: pool.cancelled == ["slow"], "the orphaned call to be cancelled")
    finally:
        client.close()
        await server.aclose()


@pytest.mark.parametrize("cpu_pool, pool_hop, expected", [
    ({"deployment": {"num_replicas": 1}}, "auto", True),
    ({"deployment": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}}, "auto",
     True),
    ({"deployment": {"num_replicas": 2}}, "auto", False),  # Serve routes among them
    ({"deployment": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}}, "auto",
     False),  # Serve's autoscaler counts its requests
    ({"deployment": {"num_replicas": 1}}, "serve", False),
])
def test_only_a_pool_of_exactly_one_replica_takes_the_local_hop(cpu_pool, pool_hop, expected):
    from blitz.settings.config import BlitzSettings
    from deployments.local_hops import qualifies

    settings = BlitzSettings.from_args({"cpu_pool": cpu_pool, "ingress": {"pool_hop": pool_hop}})
    assert qualifies(settings, "cpu") is expected
    assert not qualifies(settings, "gpu")  # scales from zero by default
