"""The per-hop timing breakdown (``blitz.timing``) and its ``server-timing`` header."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from blitz import timing
from blitz.encoders.base import Encoded


def _encoded() -> Encoded:
    return Encoded(np.zeros((1, 2), np.float32), np.ones(1, np.int64))


def test_marks_become_durations_from_the_origin():
    a, b = _encoded(), _encoded()
    timing.mark([a, b, ValueError("a failed job")], "pool-queue", 10.5)
    timing.since([a, b], "pool-queue", 10.0)
    timing.record([a, b], pool=2.0, worker_wait=0.25)
    assert a.timings == b.timings == {"pool-queue": 0.5, "pool": 2.0, "worker-wait": 0.25}


def test_results_do_not_share_timings():
    a, b = _encoded(), _encoded()
    timing.record([a], model=1.0)
    assert b.timings == {}


def test_breakdown_derives_the_hops_between_what_was_measured():
    timings = {"ingress-queue": 0.001, "call": 0.004, "pool": 0.003, "pool-queue": 0.0005,
               "worker-wait": 0.0005, "model": 0.0015}
    out = timing.breakdown(timings, total_s=0.006)
    assert list(out) == [e for e in timing.ENTRIES if e != "cache"]  # measured only with it
    assert out["ingress"] == 0.006 - 0.004 - 0.001
    assert out["handle"] == 0.004 - 0.003
    assert abs(out["pool-other"] - 0.0005) < 1e-12


def test_breakdown_without_a_handle_call_has_total_and_what_was_measured():
    assert timing.breakdown({}, 0.002) == {"total": 0.002}
    assert timing.breakdown({"model": 0.001}, 0.002) == {"total": 0.002, "model": 0.001}


def test_breakdown_never_goes_negative():
    out = timing.breakdown({"call": 0.005, "pool": 0.006, "model": 0.007}, total_s=0.004)
    assert min(out.values()) == 0.0


def test_slowest_part_wins_and_marks_are_left_out():
    fast, slow = _encoded(), _encoded()
    timing.record([fast], call=0.001)
    timing.record([slow], call=0.003, model=0.002)
    timing.mark([slow], "ingress-queue", 1.0)  # a mark nobody turned into a duration
    assert timing.slowest([fast, slow]) == {"call": 0.003, "model": 0.002}
    assert timing.slowest([]) == {}


def test_header_round_trips_in_milliseconds():
    value = timing.header_value({"call": 0.004, "pool": 0.003, "model": 0.002}, 0.005)
    assert value.startswith("total;dur=5.000, ingress;dur=1.000, handle;dur=1.000")
    assert timing.parse_header(value) == {"total": 5.0, "ingress": 1.0, "handle": 1.0,
                                          "model": 2.0, "pool-other": 1.0}


def test_parse_header_takes_other_servers_forms():
    value = 'cache;desc="Cache Read";dur=23.2, db;dur=53, app;dur=47.2, miss, x;dur=oops'
    assert timing.parse_header(value) == {"cache": 23.2, "db": 53.0, "app": 47.2}


@given(st.text(max_size=200))
def test_parse_header_takes_any_text(value):
    out = timing.parse_header(value)
    assert all(isinstance(v, float) for v in out.values())
