"""The load generator's command line (loadtest.cli) against the naive baseline server."""

from __future__ import annotations

from loadtest import cli, report
from tests.ports import free_port


def test_cli_run_and_sweep_write_reports(naive_url, tmp_path, capsys):
    out = tmp_path / "run.json"
    code = cli.main(["run", "--url", naive_url, "--api", "openai-base64", "--model", "fake",
                     "--profile", "batch32", "--requests", "8", "--warmup", "0",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    [(config, summary)] = report.read_loadtest(out)
    assert (config["texts_per_request"], config["concurrency"]) == (32, 4)
    assert summary.requests == 8 and summary.embeddings == 256
    assert "| openai-base64 | 32 | 4 |" in capsys.readouterr().out

    out = tmp_path / "sweep.json"
    code = cli.main(["sweep", "--url", naive_url, "--api", "native-json", "--model", "fake",
                     "--concurrency", "1,2", "--requests", "5", "--warmup", "0",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    assert [c["concurrency"] for c, _ in report.read_loadtest(out)] == [1, 2]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    png = tmp_path / "cmp.png"
    assert cli.main(["plot", str(out), str(out), "--label", "a", "--out", str(png)]) == 0
    assert png.exists()


def test_cli_fails_when_nothing_succeeds(tmp_path):
    code = cli.main(["run", "--url", f"http://127.0.0.1:{free_port()}", "--requests", "2",
                     "--warmup", "0", "--no-progress", "--concurrency", "1"])
    assert code == 1
    assert cli.main(["run", "--requests", "0", "--no-progress"]) == 2
