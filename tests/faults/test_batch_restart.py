"""Faults: a batch survives its runner killed mid-batch and the whole app stopped and
started again; after each, every custom_id is in the output exactly once, and no piece that
was done is run again.

The app's model takes 1 s a batch and the batch runs pieces of five lines one at a time,
so the faults land mid-batch. Each case on one engine: Ray Data, and the runner's threads.
"""

from __future__ import annotations

import json
import os
import signal
import time

import openai

from tests.faults.conftest import small_app

APP = "fault-batches"
LINES = 60


def app_args(storage: str, engine: str = "auto") -> dict:
    args = small_app([{"id": "slowfake", "source": "fake:8:0:1"}])
    args["batches"] = {"storage": storage, "chunk_lines": 5, "concurrency": 1,
                       "poll_s": 0.2, "engine": engine, "deployment": {"ray_actor_options": {
                           # as Serve's throughput-optimized mode (serve_config.yaml's) has
                           # it: handles run their router on the caller's loop, so a call
                           # from a thread without one must bring its own (LoopThread)
                           "runtime_env": {"env_vars": {
                               "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}}}}}
    return args


def submit(client: openai.OpenAI) -> str:
    body = "".join(json.dumps({"custom_id": f"id-{i}", "method": "POST", "url": "/embed",
                               "body": {"model": "slowfake", "texts": [f"line {i}"]}}) + "\n"
                   for i in range(LINES)).encode()
    file = client.files.create(file=("in.jsonl", body), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/embed",
                                 completion_window="24h").id


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def completed_exactly_once(client: openai.OpenAI, batch_id: str) -> None:
    batch = wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in (
        "completed", "failed", "cancelled", "expired") and b, 240, "the batch's end")
    assert batch.status == "completed", batch
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (LINES, LINES, 0)
    rows = [json.loads(line) for line in
            client.files.content(batch.output_file_id).content.splitlines()]
    assert sorted(r["custom_id"] for r in rows) == sorted(f"id-{i}" for i in range(LINES))
    assert batch.error_file_id is None


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=3, timeout=60)


def test_a_killed_runner_is_replaced_and_its_batch_completes_once(deploy, tmp_path):
    from ray import serve

    url = deploy(APP, app_args(str(tmp_path / "batches")))
    client = sdk(url)
    batch_id = submit(client)
    wait_for(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 10, 120,
             "two pieces done")
    runner = serve.get_deployment_handle("BatchRunner", APP)
    os.kill(runner.pid.remote().result(timeout_s=30), signal.SIGKILL)
    completed_exactly_once(client, batch_id)


def test_a_batch_resumes_after_the_app_is_stopped_and_started_again(deploy, tmp_path):
    """On the runner's own threads (``engine: threads``, the serving install's engine): the
    killed-runner case above runs its pieces on Ray Data."""
    from ray import serve

    args = app_args(str(tmp_path / "batches"), engine="threads")
    url = deploy(APP + "-stop", args)
    client = sdk(url)
    batch_id = submit(client)
    wait_for(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 10, 120,
             "two pieces done")
    serve.delete(APP + "-stop")
    record = json.loads(next((tmp_path / "batches").glob(f"*/batches/{batch_id}/batch.json"))
                        .read_text())
    assert record["status"] == "in_progress"
    assert 0 < record["request_counts"]["completed"] < LINES
    client = sdk(deploy(APP + "-stop", args))
    completed_exactly_once(client, batch_id)
