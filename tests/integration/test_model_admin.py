"""Models added, pinned, evicted and removed on the live app without a redeploy: a model
added and pinned under steady load (no request lost) loads on every pool replica, serves
the same vectors as the config's entry of the same files, is evicted and removed; the
table is in the GCS and the file mirror; the handle and the ``blitz admin`` command do the
same through their own doors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np

from tests.integration.conftest import ADMIN_KEY, APP
from tests.waiting import wait_until_async

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
JSON = {"accept": "application/json"}
LOADERS = 4  # requests in flight on the config's model throughout


async def states(client: httpx.AsyncClient, model_id: str) -> list[str]:
    reply = await client.get("/admin/models", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    row = next((m for m in reply.json()["models"] if m["id"] == model_id), None)
    return [r["state"] for r in row["replicas"]] if row else []


async def test_a_model_added_under_load_loses_no_request(blitz_app, tiny_models, app_args):
    mirror = Path(app_args["admin"]["models_file"])
    stop = asyncio.Event()
    answers: list[int] = []
    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        async def steady() -> None:
            while not stop.is_set():
                reply = await client.post("/embed", json={"model": "minilm",
                                                          "texts": ["steady load"]},
                                          headers=JSON)
                answers.append(reply.status_code)

        loaders = [asyncio.ensure_future(steady()) for _ in range(LOADERS)]
        try:
            added = await client.post("/admin/models", headers=ADMIN, json={
                "model": {"id": "added-a", "source": str(tiny_models["tiny-a"])}, "pin": True})
            assert added.status_code == 201, added.text
            assert json.loads(mirror.read_text())["models"]["added-a"]["pinned"] is True
            # pinned: loaded on every pool replica (the CPU pool and the GPU pool's stand-in)
            await wait_until_async(
                lambda: _all(states(client, "added-a"), "loaded"),
                "the pinned model loaded on every pool replica", timeout_s=120)
            served = await client.post("/embed", json={"model": "added-a",
                                                       "texts": ["hello", "world"]},
                                       headers=JSON)
            config = await client.post("/embed", json={"model": "tiny-a",
                                                       "texts": ["hello", "world"]},
                                       headers=JSON)
            assert served.status_code == 200, served.text
            np.testing.assert_allclose(served.json()["embeddings"],
                                       config.json()["embeddings"], atol=1e-6)
            listed = (await client.get("/v1/models")).json()["data"]
            assert "added-a" in [m["id"] for m in listed]

            evicted = await client.post("/admin/models/added-a/evict", headers=ADMIN)
            assert evicted.status_code == 200 and evicted.json()["pinned"] is False
            await wait_until_async(
                lambda: _all(states(client, "added-a"), "not loaded"),
                "the evicted model unloaded from every pool replica", timeout_s=60)

            removed = await client.delete("/admin/models/added-a", headers=ADMIN)
            assert removed.status_code == 200, removed.text
            gone = await client.post("/embed", json={"model": "added-a", "texts": ["x"]})
            assert gone.status_code == 404
            assert "added-a" not in json.loads(mirror.read_text())["models"]
        finally:
            stop.set()
            await asyncio.gather(*loaders)
    assert len(answers) >= LOADERS and set(answers) == {200}, sorted(set(answers))


async def _all(pending, state: str) -> bool:
    found = await pending
    return bool(found) and all(s == state for s in found)


async def test_the_table_is_in_the_gcs_and_the_handle_changes_it(blitz_app, tiny_models):
    from ray import serve

    from blitz.admin.store import read_table
    from deployments.model_admin import GcsStore

    handle = serve.get_app_handle(APP)
    row = await handle.add_model.remote({"id": "added-b", "source": str(tiny_models["tiny-b"])})
    assert row["from"] == "admin" and not row["pinned"]
    assert "added-b" in read_table(GcsStore(APP))[1]  # the newest version of the table
    texts = ["via the handle"]
    result = await handle.embed.remote(texts, model="added-b")
    reference = await handle.embed.remote(texts, model="tiny-b")
    np.testing.assert_allclose(result.embeddings, reference.embeddings, atol=1e-6)
    ids = [m["id"] for m in await handle.admin_models.remote()]
    assert ids[0] == "minilm" and "added-b" in ids
    assert (await handle.remove_model.remote("added-b"))["removed"]
    assert "added-b" not in read_table(GcsStore(APP))[1]


def test_the_blitz_command_lists_and_refuses(blitz_app, tmp_path):
    command = [str(Path(sys.executable).with_name("blitz")), "admin"]
    listed = subprocess.run([*command, "list", "--url", blitz_app, "--key", ADMIN_KEY],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "minilm" in [m["id"] for m in json.loads(listed.stdout)["models"]]
    entry = tmp_path / "entry.yaml"
    entry.write_text("id: minilm\nsource: fake:8\n")
    taken = subprocess.run([*command, "add", str(entry), "--url", blitz_app,
                            "--key", ADMIN_KEY], capture_output=True, text=True, timeout=120)
    assert taken.returncode == 1 and "served already" in taken.stderr
    keyless = subprocess.run([*command, "list", "--url", blitz_app, "--key", "wrong"],
                             capture_output=True, text=True, timeout=120)
    assert keyless.returncode == 1 and "invalid API key" in keyless.stderr
