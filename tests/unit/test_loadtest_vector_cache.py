"""``loadtest.vector_cache``'s pure parts: the Zipf query stream and the report table."""

from __future__ import annotations

import numpy as np

from loadtest.vector_cache import HIT, table, zipf_stream


def test_the_stream_is_zipf_over_the_vocabulary():
    stream = zipf_stream(1000, 1.1, seed=3)
    assert stream.min() >= 0 and stream.max() < 1000
    counts = np.sort(np.bincount(stream, minlength=1000))[::-1]
    assert counts[0] > 10 * counts[99] > 0  # a few queries are most of the traffic
    assert np.array_equal(stream, zipf_stream(1000, 1.1, seed=3))  # the same every run


def test_the_hit_entry_is_read_from_server_timing():
    found = HIT.search('total;dur=0.6, cache;dur=0.09;desc="hit 3 of 4", model;dur=1')
    assert found and (found[1], found[2]) == ("3", "4")


def test_the_table_pairs_each_round():
    rows = [{"round": 1, "app": "off", "texts_per_s": 100.0, "p50_ms": 10.0, "p99_ms": 20.0,
             "hit_share": None},
            {"round": 1, "app": "on", "texts_per_s": 250.0, "p50_ms": 4.0, "p99_ms": 9.0,
             "hit_share": 0.61}]
    out = table(rows)
    assert "| 1 | on | 250.0 | 4.0 | 9.0 | 61% | 2.50x |" in out
