"""The wire formats table (loadtest.formats)."""

from __future__ import annotations

import time

import orjson

from loadtest import cli, formats


def test_formats_round_trip_and_report(tmp_path):
    rows = formats.compare([(4, 8)], min_time_s=0.0005)
    names = [r.format for r in rows]
    assert names == [f.name for f in formats.FORMATS]
    by_name = {r.format: r for r in rows}
    assert by_name["raw"].bytes == 4 * 8 * 4
    assert by_name["msgpack"].bytes < by_name["json-orjson"].bytes < by_name["json-naive"].bytes
    table = formats.markdown(rows)
    assert "| 4x8 | raw | 128 | 1.00 |" in table
    out = tmp_path / "f.json"
    assert cli.main(["formats", "--shapes", "2x4", "--min-time", "0.0005",
                     "--out", str(out)]) == 0
    assert orjson.loads(out.read_bytes())["kind"] == "formats"


def test_formats_time_encode_and_decode_per_call():
    raw = next(f for f in formats.FORMATS if f.name == "raw")

    def encode(a):
        time.sleep(0.001)
        return raw.encode(a)

    def decode(body, headers):
        time.sleep(0.003)
        return raw.decode(body, headers)

    slow = formats.Format("slow raw", encode, decode)
    [row] = formats.compare([(2, 4)], formats=[slow], min_time_s=0.005)
    assert 1000 <= row.encode_us < 10_000 and 3000 <= row.decode_us < 30_000
    assert row.decode_us > row.encode_us
