"""Images on the HTTP API and the pool path (issue 47), on tiny random CLIP and SigLIP
models built from configs: every way of sending an image gives the reference vector
(``get_image_features``, normalized), texts of the same model the reference text vector,
rerank and similarity the cosines of the two; a real ``PoolReplica`` prepares images
before its queue; every hostile or wrong input is a 4xx naming what to fix."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import threading

import httpx
import numpy as np
import pytest
from PIL import Image

from blitz import codecs
from blitz.hop_messages import EmbedJob, ImageEmbedJob
from blitz.images.inputs import SizedImage, allowed, jobs_of
from blitz.ingress.routing import choose_pool
from blitz.pool.image_prep import PreparedImages
from blitz.pool.replica import PoolReplica
from blitz.settings.config import BlitzSettings, RoutingSettings
from blitz.settings.images import ImageSettings
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_vision import build_tiny_dual_encoder, random_images
from tests.unit.test_dual_encoder import reference
from tests.unit.test_image_decode import png_declaring

TEXTS = ["a red cat", "blue sea"]


def pictures() -> list[Image.Image]:
    return random_images(11, [(32, 32), (64, 40), (90, 17)])


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module", params=["clip", "siglip"])
def tiny(request, tmp_path_factory):
    path = build_tiny_dual_encoder(tmp_path_factory.mktemp(request.param), request.param,
                                   seed=9)
    files = [encoded(p) for p in pictures()]
    # the reference sees what the server decodes: the files' pixels, as RGB
    decoded = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
    text_rows, image_rows = reference(path, request.param, TEXTS, decoded)
    return path, files, text_rows, image_rows


class Files(http.server.BaseHTTPRequestHandler):
    """A loopback server for the URL tests: /ok.png, /big, /moved."""

    body = b""

    def do_GET(self):  # noqa: N802 - the handler's name
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("location", "/ok.png")
            self.end_headers()
            return
        data = self.body if self.path == "/ok.png" else b"\x89PNG" + b"\0" * 30_000
        self.send_response(200)
        if self.path != "/unsized":  # /unsized: no length said, the limit found by reading
            self.send_header("content-length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the client stopped reading at its limit
            pass

    def log_message(self, *_):
        pass


@pytest.fixture(scope="module")
def file_server(tiny):
    Files.body = tiny[1][0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def settings_for(path, file_server: str = "http://127.0.0.1:9") -> BlitzSettings:
    return BlitzSettings.from_args({
        "models": [{"id": "clip", "source": str(path), "kind": "dual-encoder"},
                   {"id": "emb", "source": "fake:8"}],
        "cpu_pool": {"max_batch_size": 2},
        "images": {"max_bytes": 20_000, "max_pixels": 100_000, "max_per_request": 8,
                   "url_allow": [file_server + "/"]}})


@pytest.fixture
async def client(tiny, file_server):
    settings = settings_for(tiny[0], file_server)
    async with api_client(settings) as c:
        yield c


def rows(reply: httpx.Response) -> np.ndarray:
    assert reply.status_code == 200, reply.text
    return np.asarray(reply.json()["embeddings"], dtype=np.float32)


async def test_every_way_of_sending_an_image_gives_the_reference_vector(client, tiny,
                                                                        file_server):
    _, files, _, expected = tiny
    as_base64 = [base64.b64encode(f).decode() for f in files]
    got = rows(await client.post("/embed", json={"images": as_base64, "model": "clip"}))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    got = rows(await client.post("/embed", json={"images": [data_url(f) for f in files],
                                                 "model": "clip"}))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    reply = await client.post("/embed", content=codecs.pack({"images": files, "model": "clip"}),
                              headers={"content-type": "application/msgpack"})
    assert reply.status_code == 200
    np.testing.assert_allclose(codecs.unpack(reply.content)["embeddings"], expected, atol=1e-5)
    got = rows(await client.post("/embed", json={"images": [file_server + "/ok.png"],
                                                 "model": "clip"}))
    np.testing.assert_allclose(got, expected[:1], atol=1e-5)
    for alone in range(len(files)):  # one image alone: the same row as in the batch
        got = rows(await client.post("/embed", json={"images": [as_base64[alone]],
                                                     "model": "clip"}))
        np.testing.assert_allclose(got[0], expected[alone], atol=1e-5)


async def test_openai_and_infinity_image_bodies_and_texts_of_the_same_model(client, tiny):
    _, files, text_rows, expected = tiny
    for path, body in (("/v1/embeddings", {"modality": "image"}), ("/embeddings_image", {})):
        reply = await client.post(path, json={"input": [data_url(f) for f in files],
                                              "model": "clip", **body})
        assert reply.status_code == 200, reply.text
        got = np.asarray([d["embedding"] for d in reply.json()["data"]])
        np.testing.assert_allclose(got, expected, atol=1e-5)
    got = rows(await client.post("/embed", json={"texts": TEXTS, "model": "clip"}))
    np.testing.assert_allclose(got, text_rows, atol=1e-5)


async def test_rerank_and_similarity_score_images_against_a_text(client, tiny):
    _, files, text_rows, expected = tiny
    cosines = expected @ text_rows[0]
    images = [data_url(f) for f in files]
    reply = await client.post("/rerank", json={"query": TEXTS[0], "images": images,
                                               "model": "clip", "top_n": 2})
    assert reply.status_code == 200, reply.text
    hits = reply.json()["results"]
    assert [h["index"] for h in hits] == list(np.argsort(-cosines, kind="stable")[:2])
    np.testing.assert_allclose([h["relevance_score"] for h in hits],
                               np.sort(cosines)[::-1][:2], atol=1e-5)
    reply = await client.post("/similarity", json={
        "inputs": {"source_sentence": TEXTS[0], "images": images}, "model": "clip"})
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(reply.json(), cosines, atol=1e-5)


GOOD = "iVBORw0KGgo="  # a PNG signature alone: sized and sniffed, then refused as truncated


@pytest.mark.parametrize("body,status,param", [
    ({"images": ["data:image/png;base64,@@@"], "model": "clip"}, 422, "images[0]"),
    ({"images": ["bm90IGFuIGltYWdl"], "model": "clip"}, 415, "images[0]"),
    ({"images": [GOOD], "model": "emb"}, 422, "model"),
    ({"images": ["A" * 40_000], "model": "clip"}, 413, "images[0]"),
    ({"images": [GOOD] * 9, "model": "clip"}, 413, "images"),
    ({"images": [12], "model": "clip"}, 422, "images[0]"),
    ({"images": ["https://example.com/x.png"], "model": "clip"}, 422, "images[0]"),
    ({"images": [], "model": "clip"}, 422, "images"),
])
async def test_refusals_name_the_image_and_the_limit(client, body, status, param):
    reply = await client.post("/embed", json=body)
    assert reply.status_code == status, reply.text
    assert error_body(reply)["param"] == param


async def test_hostile_files_and_urls_are_refused_with_their_limit(client, file_server):
    for data, status in ((png_declaring(100_000, 100_000), 413), (encoded(Image.new("RGB", (8, 8)), "TIFF"), 415),
                         (encoded(Image.new("RGB", (8, 8)))[:40], 422)):
        reply = await client.post("/embed", content=codecs.pack({"images": [data],
                                                                 "model": "clip"}),
                                  headers={"content-type": "application/msgpack"})
        assert reply.status_code == status, reply.content
    for url, status in (("/moved", 422), ("/big", 413), ("/unsized", 413)):
        reply = await client.post("/embed", json={"images": [file_server + url],
                                                  "model": "clip"})
        assert reply.status_code == status, reply.text
        assert error_body(reply)["param"] == "images[0]"


def test_the_url_allow_list_matches_scheme_host_port_and_path():
    limits = ImageSettings(url_allow=["https://cdn.example.com/images/"])
    assert allowed("https://cdn.example.com/images/a.png", limits)
    for url in ("http://cdn.example.com/images/a.png", "https://cdn.example.com.evil/images/",
                "https://cdn.example.com:444/images/a.png", "https://cdn.example.com/other",
                "https://user@cdn.example.com/images/a.png", "https://[::1/x"):
        assert not allowed(url, limits), url
    with pytest.raises(ValueError):
        ImageSettings(url_allow=["ftp://x/"])


def test_jobs_hold_at_most_the_count_the_bytes_and_the_pixels():
    images = [SizedImage(i, b"x" * n, 1) for i, n in enumerate((10, 10, 30, 5, 5, 5, 100))]
    jobs = jobs_of(images, 3, 40, 10**9)
    assert [[len(s.data) for s in j] for j in jobs] == [[10, 10], [30, 5, 5], [5], [100]]
    assert [s for j in jobs for s in j] == images
    by_pixels = [SizedImage(i, b"x", p) for i, p in enumerate((6, 4, 1, 20, 3, 3, 3))]
    jobs = jobs_of(by_pixels, 100, 10**9, 10)
    assert [[s.pixels for s in j] for j in jobs] == [[6, 4], [1], [20], [3, 3, 3]]


def test_the_router_sends_few_images_to_the_cpu_and_many_to_the_gpu():
    policy = RoutingSettings(gpu_min_batch=10, gpu_min_images=4)
    pools = running = {"cpu", "gpu"}
    assert choose_pool("dual-encoder", 3, pools, running, policy, images=True).pool == "cpu"
    assert choose_pool("dual-encoder", 4, pools, running, policy, images=True).pool == "gpu"
    assert choose_pool("dual-encoder", 4, pools, running, policy).pool == "cpu"  # texts


async def test_a_pool_replica_prepares_images_before_its_queue(tiny):
    path, files, text_rows, expected = tiny
    replica = PoolReplica(settings_for(path), "cpu")
    batches: list[list[type]] = []
    run_batch = replica._run_batch

    async def spy(model_id, jobs):
        batches.append([type(j) for j in jobs])
        return await run_batch(model_id, jobs)

    replica._run_batch = spy
    results = await replica.run_jobs("clip", [
        ImageEmbedJob(files[:2]), EmbedJob(texts=TEXTS), ImageEmbedJob([b"junk"]),
        ImageEmbedJob(files[2:])])
    np.testing.assert_allclose(results[0].values, expected[:2], atol=1e-5)
    np.testing.assert_allclose(results[1].values, text_rows, atol=1e-5)
    assert getattr(results[2], "status", None) == 415  # alone: the others go on
    np.testing.assert_allclose(results[3].values, expected[2:], atol=1e-5)
    ran = {t for batch in batches for t in batch}
    assert ImageEmbedJob not in ran and PreparedImages in ran  # decoded before the queue
    # the fake model kind refuses images with the dual-encoder's message
    refused = await replica.run_jobs("emb", [ImageEmbedJob(files[:1])])
    assert getattr(refused[0], "status", None) == 422


async def test_images_preparing_concurrently_share_the_model(tiny):
    path, files, _, expected = tiny
    replica = PoolReplica(settings_for(path), "cpu")
    got = await asyncio.gather(*(replica.run_jobs("clip", [ImageEmbedJob([f])])
                                 for f in files))
    for k, results in enumerate(got):
        np.testing.assert_allclose(results[0].values[0], expected[k], atol=1e-5)


async def test_info_and_models_describe_a_dual_encoder(client, tiny):
    dimension = tiny[3].shape[1]
    info = (await client.get("/info", params={"model": "clip"})).json()
    assert info["model_type"] == {"embedding": {"pooling": "projection"}}
    models = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert models["clip"]["kind"] == "dual-encoder"
    assert models["clip"]["dimension"] == dimension
    reply = await client.post("/embed", json={"images": [data_url(tiny[1][0])],
                                              "model": "clip", "dimensions": dimension + 1})
    assert reply.status_code == 422 and error_body(reply)["param"] == "dimensions"
    reply = await client.post("/embed", json={"images": [data_url(tiny[1][0])],
                                              "model": "clip", "dimensions": 4,
                                              "dtype": "int8"})
    assert reply.status_code == 200 and np.asarray(reply.json()["embeddings"]).shape == (1, 4)
