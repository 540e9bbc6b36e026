"""Bulk jobs killed mid-run: SIGKILL to the driver (a ``blitz embed`` process), and
separately to one encoder actor, in the middle of a multi-file job; then a rerun. After
it, OUTPUT holds exactly one row per good input row, every vector equals in-process
encoding, the rerun kept what the killed attempt had published, and nothing of the killed
attempt is left (no staging directory, no half-published unit)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blitz.loading.load import load_encoder
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from deployments.bulk import embed_dataset
from tests.waiting import wait_until

FILES, ROWS = 6, 40
SLOW = ModelSpec(id="slow", source="fake:8:0:0.08")  # 80 ms per 4-text batch
ROOT = Path(__file__).resolve().parents[2]


def text(file: int, row: int) -> str:
    return f"file {file} row {row} says {'cats' if row % 3 else 'stocks'}"


@pytest.fixture
def corpus(tmp_path) -> Path:
    """Six files in three formats; ids unique across files; every 7th text empty."""
    root = tmp_path / "in"
    root.mkdir()
    for k in range(FILES):
        rows = [(k * 1000 + i, "" if i % 7 == 6 else text(k, i)) for i in range(ROWS)]
        if k % 3 == 0:
            pq.write_table(pa.table({"id": [r[0] for r in rows], "text": [r[1] for r in rows]}),
                           root / f"f{k}.parquet")
        elif k % 3 == 1:
            (root / f"f{k}.jsonl").write_text("".join(
                json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
        else:
            (root / f"f{k}.csv").write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows))
    return root


def expected() -> dict[int, str]:
    return {k * 1000 + i: text(k, i) for k in range(FILES) for i in range(ROWS) if i % 7 != 6}


def options() -> BulkSettings:
    return BulkSettings(model="slow", batch_size=4, actors=2, device="cpu")


def published(out: Path) -> int:
    return len(list(out.glob("*/_SUCCESS")))


def check_output(out: Path) -> None:
    """One row per good input row, each vector the in-process encoding of its text, and
    nothing of a killed attempt left."""
    tables = [pq.read_table(p) for p in sorted(out.glob("*/part-00000.parquet"))]
    table = pa.concat_tables(tables)
    ids = table.column("id").to_pylist()
    want = expected()
    assert sorted(ids) == sorted(want)  # exactly once each
    encoder = load_encoder(SLOW, "cpu")
    reference = encoder.embed([want[i] for i in ids], normalize=True).values
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got, reference, atol=1e-6)
    assert not (out / "_attempts").exists()
    assert not list(out.glob("*/_PUBLISHING"))
    assert published(out) == FILES
    refused = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert len(refused) == FILES * ROWS - len(want)


def encoder_actors() -> list[int]:
    """Pids of the job's encoder actors (Ray titles them after the map step they run)."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if command.startswith("ray::") and "EmbedBatches" in command:
            found.append(process.info["pid"])
    return found


def test_sigkill_to_the_driver_mid_job_then_a_rerun(serve_instance, corpus, tmp_path):
    config = tmp_path / "serve_config.yaml"
    config.write_text(json.dumps({"applications": [{"name": "blitz", "args": {
        "models": [SLOW.model_dump(exclude_defaults=True)]}}]}))
    out = tmp_path / "out"
    driver = subprocess.Popen(
        [sys.executable, "-m", "deployments.cli", "embed", str(corpus), str(out), "--config",
         str(config), "--model", "slow", "--batch-size", "4", "--actors", "2", "--device",
         "cpu", "--address", "auto", "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: published(out) >= 1 or driver.poll() is not None, "the first unit",
                   240)
        assert driver.poll() is None, driver.stdout.read().decode()[-2000:]
        assert published(out) < FILES
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()
    kept = published(out)
    report = embed_dataset(str(corpus), str(out), settings=BlitzSettings(models=[SLOW]),
                           options=options())
    assert len(report.skipped) >= kept >= 1  # what was published stays published
    check_output(out)


def test_sigkill_to_an_encoder_actor_mid_job_then_a_rerun(serve_instance, corpus, tmp_path):
    out = tmp_path / "out"
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["report"] = embed_dataset(str(corpus), str(out),
                                              settings=BlitzSettings(models=[SLOW]),
                                              options=options())
        except Exception as exc:  # the job may fail: the rerun below must then finish it
            outcome["error"] = exc

    job = threading.Thread(target=run)
    job.start()
    wait_until(lambda: published(out) >= 1 or not job.is_alive(), "the first unit", 240)
    assert job.is_alive() and published(out) < FILES
    workers = encoder_actors()
    assert workers, "no encoder actor found"
    os.kill(workers[0], signal.SIGKILL)
    job.join(300)
    assert not job.is_alive()
    again = embed_dataset(str(corpus), str(out), settings=BlitzSettings(models=[SLOW]),
                          options=options())
    if "error" not in outcome:  # the job survived the kill: the rerun had nothing to do
        assert again.rows_written == 0
    check_output(out)
