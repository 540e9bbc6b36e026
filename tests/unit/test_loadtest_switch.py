"""The switch benchmark's request plan: each request does what its label says."""

from __future__ import annotations

from collections import Counter

from loadtest.switch import BACKENDS, Lru, round_plan, summary


def test_lru_labels_requests_as_serve_multiplexing_treats_them():
    lru = Lru(slots=2)
    assert [lru.use(m) for m in ["a", "a", "b", "a", "c", "b"]] == [
        "replica-first", "same", "first-load", "switch", "evict-load", "evict-load"]
    assert lru.evictions == 2 and list(lru.models) == ["c", "b"]


def test_a_round_has_every_case_for_every_backend():
    plan = round_plan(BACKENDS, evictions=2, pairs=3, turn=1)
    lru = Lru()
    cases = Counter((m.rsplit("-", 1)[0], lru.use(m)) for m in plan)
    for backend in BACKENDS:
        # a fresh replica: one free slot each; the first of them also pays the imports
        assert cases[backend, "first-load"] + cases[backend, "replica-first"] == 1
        assert cases[backend, "evict-load"] >= 2
        assert cases[backend, "same"] == 2 * 3 and cases[backend, "switch"] >= 2 * 3 - 2  # the first a and b may load
    assert plan[0] == "torch-bf16-1"  # the first-load order turns with the round
    assert cases["torch-bf16", "replica-first"] == 1


def test_summary_reports_median_and_p90_per_case():
    rows = summary({"torch": {"same": [1.0, 2.0, 3.0, 4.0, 100.0], "switch": [5.0]}})
    assert [(r["case"], r["n"], r["median_ms"]) for r in rows] == [
        ("same", 5, 3.0), ("switch", 1, 5.0)]
    assert 4.0 < rows[0]["p90_ms"] < 100.0
