"""scripts/lifecycle.py: a run looks after Serve's HAProxy without reading every process of
the machine five times a second: the HAProxy processes it knows are checked alone, and the
machine is scanned again when one of them is gone or RESCAN_S has passed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import lifecycle  # noqa: E402


@pytest.fixture
def machine(monkeypatch):
    """HAProxy processes alive (pid -> config) and the scans that found them."""
    state = {"alive": {11: "/h/n/haproxy.cfg"}, "scans": 0}

    def scan(sid):
        state["scans"] += 1
        return sorted(state["alive"].items())

    monkeypatch.setattr(lifecycle, "_run_haproxies", scan)
    monkeypatch.setattr(lifecycle, "_alive", lambda pid: pid in state["alive"])
    return state


def test_known_haproxies_are_checked_alone_until_rescan_s(machine, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(lifecycle.time, "monotonic", lambda: clock[0])
    known, scanned = lifecycle._serving_haproxies(7, [], 0.0)
    assert known == [(11, "/h/n/haproxy.cfg")] and machine["scans"] == 1
    for _ in range(5):  # a second of ticks: no scan
        clock[0] += 0.2
        known, scanned = lifecycle._serving_haproxies(7, known, scanned)
    assert machine["scans"] == 1 and known == [(11, "/h/n/haproxy.cfg")]
    clock[0] = scanned + lifecycle.RESCAN_S  # a new HAProxy beside it is found in time
    known, scanned = lifecycle._serving_haproxies(7, known, scanned)
    assert machine["scans"] == 2


def test_a_known_haproxy_gone_is_noticed_on_the_next_tick(machine, monkeypatch):
    monkeypatch.setattr(lifecycle.time, "monotonic", lambda: 100.0)
    known, scanned = lifecycle._serving_haproxies(7, [], 0.0)
    del machine["alive"][11]  # HAProxy died (or a reload replaced it)
    known, scanned = lifecycle._serving_haproxies(7, known, scanned)
    assert known == [] and machine["scans"] == 2  # the stand-in hears it at once
    known, scanned = lifecycle._serving_haproxies(7, known, scanned)
    assert machine["scans"] == 3  # none known: every tick scans, as before


def test_the_node_watch_scans_once_then_checks_raylet_and_gcs_alone(monkeypatch):
    procs = {5: b"raylet", 6: b"gcs_server", 7: b"python3"}  # session 9's processes
    scans = []

    def session(sid):
        scans.append(sid)
        return sorted(procs)

    monkeypatch.setattr(lifecycle, "_session", session)
    monkeypatch.setattr(lifecycle, "_alive", lambda pid: pid in procs)
    monkeypatch.setattr(lifecycle, "_read",
                        lambda pid, name: procs.get(pid, b"") + b"\n" if name == "comm" else b"")
    up = lifecycle._node_watch(9)
    assert up() and up() and up() and scans == [9]  # one scan, then two reads a tick
    procs[5] = b"bash"  # the raylet's pid now names another process
    assert not up() and scans == [9, 9]  # gone: scanned again, and the node is down
    procs[8] = b"raylet"  # (a test's raylet back: found by the next scan)
    assert up() and scans == [9, 9, 9]
    del procs[6]  # the GCS died
    assert not up()
