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
    assert "the card's `serve run` >= 0.9x scripts/serve.sh, single: met" in text
