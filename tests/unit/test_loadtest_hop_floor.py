"""loadtest.hop_floor: the local hop's round trip between two plain processes."""

from __future__ import annotations

import json

from loadtest.hop_floor import main


def test_the_hop_floor_answers_every_call_and_reports_its_p50(tmp_path, capsys):
    out = tmp_path / "hop.json"
    assert main(["--per-round", "20", "--warmup", "2", "--out", str(out)]) == 0
    served = json.loads(out.read_text())["summary"]["served"]
    assert served["n"] == 20 and 0 < served["p50"] <= served["p99"]
