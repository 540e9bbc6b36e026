"""Fault: small requests that would cost without bound (issue 54), each sent to a live app
beside a stream of ordinary one-text requests.

Every hostile request is refused with a 4xx naming its limit, before any model work; every
ordinary request beside it gets its 200; /health keeps answering within a second; and the
pool replica's memory stays flat (it never sees the work).
"""

from __future__ import annotations

import asyncio
import base64
import io
import time

import httpx
import pytest

from tests.error_body import error_body
from tests.faults.conftest import small_app
from tests.tiny_hybrid import build_tiny_hybrid
from tests.tiny_models import minilm_dir
from tests.tiny_vision import build_tiny_dual_encoder

APP = "fault-costs"
FLAT_BYTES = 256 * 2**20  # what the pool replica may grow by over one hostile request
LONG = "!" * 100_000  # 100,000 tokens of MiniLM's: 394 windows of 256


def one_bit_png(side: int) -> str:
    """A 1-bit PNG of ``side`` x ``side`` (~5 KB at 6,324: 114 MiB once decoded), base64."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (side, side)).save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode()


BOMB = one_bit_png(6324)


def hostile(name: str) -> tuple[str, dict, int, str]:
    """(route, JSON body, status, what the error names) of each hostile request."""
    words = " ".join(["retrieval"] * 120)
    return {
        "chunk on a model that does not opt in": (
            "/embed", {"texts": [LONG] * 2, "long_inputs": "chunk", "model": "minilm"}, 422,
            "request_chunking"),
        "return_chunks on a model that does not opt in": (
            "/embed", {"texts": [LONG] * 2, "return_chunks": True, "model": "minilm"}, 422,
            "request_chunking"),
        "20 texts of 100,000 chars chunked": (
            "/embed", {"texts": [LONG] * 20, "long_inputs": "chunk", "model": "chunky"}, 413,
            "max_windows_per_request"),
        "20 texts of 100,000 chars with return_chunks": (
            "/embed", {"texts": [LONG] * 20, "return_chunks": True, "model": "chunky"}, 413,
            "max_windows_per_request"),
        "a 1 MiB instruction on 64 texts": (
            "/embed", {"texts": ["a"] * 64, "instruction": "x" * 2**20, "model": "instruct"},
            413, "max_instruction_chars"),
        "ColBERT vectors of 2048 texts": (
            "/embed_hybrid", {"texts": [words] * 2048, "outputs": ["colbert"], "model": "m3"},
            413, "max_token_vectors_per_request"),
        "token vectors of a hybrid model": (
            "/embed_all", {"inputs": [words] * 2048, "model": "m3"}, 413,
            "max_token_vectors_per_request"),
        "24 one-bit PNG bombs of 40 Mpx (~160 KB)": (
            "/embed", {"images": [BOMB] * 24, "model": "clip"}, 413,
            "images.max_request_pixels"),
    }[name]


NAMES = ["chunk on a model that does not opt in",
         "return_chunks on a model that does not opt in",
         "20 texts of 100,000 chars chunked", "20 texts of 100,000 chars with return_chunks",
         "a 1 MiB instruction on 64 texts", "ColBERT vectors of 2048 texts",
         "token vectors of a hybrid model", "24 one-bit PNG bombs of 40 Mpx (~160 KB)"]


@pytest.fixture(scope="module")
def costs_app(deploy, tmp_path_factory):
    minilm = str(minilm_dir())
    hybrid = build_tiny_hybrid(tmp_path_factory.mktemp("m3") / "m", seed=4)
    clip = build_tiny_dual_encoder(tmp_path_factory.mktemp("clip") / "m")
    return deploy(APP, small_app([
        {"id": "minilm", "source": minilm},
        {"id": "chunky", "source": minilm, "request_chunking": True},
        {"id": "instruct", "source": minilm,
         "instruction_template": "Instruct: {instruction}\nQuery: "},
        {"id": "m3", "source": str(hybrid), "kind": "hybrid"},
        {"id": "clip", "source": str(clip), "kind": "dual-encoder"},
    ]))


async def pool_rss() -> int:
    from ray import serve

    stats = await serve.get_deployment_handle("CPUPool", APP).stats.remote()
    return int(stats["rss_bytes"])


@pytest.mark.parametrize("name", NAMES)
async def test_a_costly_request_is_refused_while_ordinary_ones_are_answered(costs_app, name):
    route, body, status, names = hostile(name)
    failures: list[str] = []
    health: list[float] = []
    answered = 0
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=costs_app, timeout=60) as client:
        warm = await client.post("/embed", json={"texts": ["warm up"], "model": "minilm"})
        assert warm.status_code == 200, warm.text
        before = await pool_rss()

        async def ordinary() -> None:
            nonlocal answered
            while not done.is_set():
                r = await client.post("/embed", json={"texts": ["an ordinary query"],
                                                      "model": "minilm"},
                                      headers={"accept": "application/json"})
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                answered += 1

        async def poll_health() -> None:
            while not done.is_set():
                started = time.monotonic()
                r = await client.get("/health")
                health.append(time.monotonic() - started)
                if r.status_code != 200:
                    failures.append(f"/health {r.status_code}")
                await asyncio.sleep(0.05)

        beside = [asyncio.ensure_future(ordinary()), asyncio.ensure_future(poll_health())]
        await asyncio.sleep(0.5)  # the stream is flowing before the hostile request
        r = await client.post(route, json=body, headers={"accept": "application/json"})
        await asyncio.sleep(0.5)
        done.set()
        await asyncio.gather(*beside)
        after = await pool_rss()
    print(f"\n{name}: {r.status_code}; {answered} ordinary answers; slowest /health "
          f"{max(health):.3f} s; pool RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB")
    assert r.status_code == status, r.text[:300]
    error = error_body(r)  # TEI's shape on its routes (a string), else Blitz's
    assert names in (error if isinstance(error, str) else error["message"])
    assert failures == [] and answered > 0
    assert health and max(health) < 1.0
    assert after - before < FLAT_BYTES
