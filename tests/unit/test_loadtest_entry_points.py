"""loadtest.entry_points: the entry points' rounds as ratios to scripts/serve.sh."""

from __future__ import annotations

import orjson

from loadtest.entry_points import report


def _run(path, emb_s: float, cpu_ms: float, errors: int = 0) -> None:
    path.write_bytes(orjson.dumps({"results": [
        {"embeddings_per_s": emb_s, "server_cpu_ms_per_request": cpu_ms, "errors": errors}]}))


def _user(path, served: float, inprocess: float = 3.0) -> None:
    path.write_bytes(orjson.dumps({"summary": {"served": {"p50": served},
                                               "inprocess": {"p50": inprocess}}}))


def test_ratios_are_taken_within_each_round_against_serve_sh(tmp_path):
    for r, (card, base) in enumerate([(90.0, 100.0), (200.0, 200.0), (50.0, 40.0)], 1):
        d = tmp_path / f"r{r}"
        d.mkdir()
        for profile, scale in (("single", 1), ("batch32", 3)):
            _run(d / f"card-{profile}.json", card * scale, 5.0)
            _run(d / f"serve-sh-{profile}.json", base * scale, 4.0)
            _run(d / f"default-proxy-{profile}.json", base * scale * 0.4, 12.0,
                 errors=1 if r == 3 else 0)  # a round with errors is left out
        for leg, p50 in (("card", 9.0), ("serve-sh", 8.0), ("default-proxy", 15.0),
                         ("floor", 5.0)):
            _user(d / f"oneuser-{leg}.json", p50 + r)
    text = report(tmp_path)
    card_row = next(line for line in text.splitlines() if "serve_config.yaml" in line)
    assert "1.00x (0.90-1.25x, 3 rounds)" in card_row  # median of 0.9, 1.0, 1.25
    assert "4.00 ms (4.00-4.00, 3 rounds)" in card_row  # one user p50 minus the floor's
    proxy_row = next(line for line in text.splitlines() if "default proxy" in line)
    assert "0.40x (0.40-0.40x, 2 rounds)" in proxy_row
    assert "the card's `serve run` >= 0.9x scripts/serve.sh in every round, single: met" in text
    assert "0.90, 1.00, 1.25" in text  # the card's single ratios, round by round
    assert "PSS idle within 10% of scripts/serve.sh's in every round: not measured" in text


def _pss(path, processes: dict[str, int]) -> None:
    path.write_bytes(b"\n".join(orjson.dumps({"pid": i, "name": name, "pss_kib": kib})
                                for i, (name, kib) in enumerate(processes.items())))


def test_every_round_must_meet_the_targets_and_pss_is_reported_by_process(tmp_path):
    for r, card in enumerate([95.0, 85.0, 120.0], 1):  # round 2 falls under 0.9x
        d = tmp_path / f"r{r}"
        d.mkdir()
        for profile in ("single", "batch32"):
            _run(d / f"card-{profile}.json", card, 5.0)
            _run(d / f"serve-sh-{profile}.json", 100.0, 5.0)
        for kind in ("idle", "peak"):
            _pss(d / f"serve-sh-pss-{kind}.jsonl", {"raylet": 100 * 1024, "haproxy": 1024})
            _pss(d / f"card-pss-{kind}.jsonl", {"raylet": 100 * 1024, "haproxy": 1024,
                                                 "serve run": (5 if kind == "idle" else 30) * 1024})
    text = report(tmp_path)
    assert "single: **not met** (lowest round 0.85x)" in text  # the median, 0.95x, would pass
    assert "PSS idle within 10% of scripts/serve.sh's in every round: met" in text
    assert "PSS peak within 10% of scripts/serve.sh's in every round: **not met** (highest round 1.30x)" in text
    assert "131 (1.30x)" in text
    assert "| serve run | 5 | - |" in text and "| **total** | 106 | 101 |" in text


def test_cpu_per_request_is_split_between_processes_by_their_cpu_time(tmp_path):
    from loadtest.entry_points import cpu_by_process, cpu_shares

    d = tmp_path / "r1"
    d.mkdir()
    _run(d / "card-single.json", 100.0, 6.0)
    lines = [{"pid": 1, "name": "raylet", "pss_kib": 1, "cpu_s": 1.0},
             {"pid": 2, "name": "ray::ServeReplica:blitz:Ingress", "pss_kib": 1, "cpu_s": 5.0}]
    (d / "card-single-procs0.jsonl").write_bytes(b"\n".join(orjson.dumps(p) for p in lines))
    lines[0]["cpu_s"], lines[1]["cpu_s"] = 2.0, 7.0  # +1 s and +2 s: a third and two thirds
    lines.append({"pid": 3, "name": "log monitor", "pss_kib": 1, "cpu_s": 0.0})  # came later
    (d / "card-single-procs1.jsonl").write_bytes(b"\n".join(orjson.dumps(p) for p in lines))
    assert cpu_shares(d, "card", "single") == {
        "raylet": 2.0, "ray::ServeReplica:blitz:Ingress": 4.0, "log monitor": 0.0}
    table = cpu_by_process([d], "single")
    assert "| ray::ServeReplica:blitz:Ingress | 4.000 |" in table
    assert "log monitor" not in table and "| **total** | 6.000 |" in table
