"""Images end to end on the live app (issue 47): a tiny random CLIP in the config serves
image and text vectors equal to the reference over HTTP (Blitz's body, OpenAI's client,
Infinity's client) and the handle; few images go to the CPU pool, many to the GPU pool;
rerank and similarity score images against a text; a hostile image is a 4xx."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from blitz import codecs
from tests.error_body import error_body
from tests.tiny_vision import random_images
from tests.unit.test_dual_encoder import reference
from tests.unit.test_image_decode import png_declaring

TEXTS = ["a photo of a cat", "blue sea"]


def files() -> list[bytes]:
    out = []
    for image in random_images(21, [(32, 32), (48, 30), (20, 60), (40, 40), (33, 17)]):
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        out.append(buffer.getvalue())
    return out


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def expected(tiny_clip):
    pictures = [Image.open(io.BytesIO(f)).convert("RGB") for f in files()]
    return reference(tiny_clip, "clip", TEXTS, pictures)


def test_http_images_and_texts_equal_the_reference(http, expected):
    text_rows, image_rows = expected
    reply = http.post("/embed", content=codecs.pack({"images": files(), "model": "tiny-clip"}),
                      headers={"content-type": "application/msgpack"})
    assert reply.status_code == 200, reply.content
    np.testing.assert_allclose(codecs.unpack(reply.content)["embeddings"], image_rows,
                               atol=1e-5)
    reply = http.post("/embed", json={"images": [data_url(f) for f in files()[:1]],
                                      "model": "tiny-clip"})
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(reply.json()["embeddings"], image_rows[:1], atol=1e-5)
    reply = http.post("/embed", json={"texts": TEXTS, "model": "tiny-clip"})
    np.testing.assert_allclose(reply.json()["embeddings"], text_rows, atol=1e-5)


def test_openai_and_infinity_clients_send_images(blitz_app, expected):
    from infinity_client import Client
    from infinity_client.api.default import embeddings_image
    from infinity_client.models import ImageEmbeddingInput
    from openai import OpenAI

    image_rows = expected[1]
    urls = [data_url(f) for f in files()]
    with OpenAI(base_url=blitz_app + "/v1", api_key="-", max_retries=0) as openai:
        got = openai.embeddings.create(input=urls, model="tiny-clip",
                                       extra_body={"modality": "image"})
    np.testing.assert_allclose([d.embedding for d in got.data], image_rows, atol=1e-5)
    with Client(base_url=blitz_app, timeout=120) as client:
        reply = embeddings_image.sync(client=client,
                                      body=ImageEmbeddingInput(input_=urls, model="tiny-clip"))
    np.testing.assert_allclose([d.embedding for d in reply.data], image_rows, atol=1e-5)


async def test_the_handle_embeds_and_scores_images_routed_by_count(blitz_app, expected):
    from ray import serve

    text_rows, image_rows = expected
    handle = serve.get_app_handle("it-main")
    many = await handle.embed_images.remote(files(), model="tiny-clip")
    np.testing.assert_allclose(many.embeddings, image_rows, atol=1e-5)
    assert many.pool == "gpu"  # 5 images >= routing.gpu_min_images (4)
    one = await handle.embed_images.remote(files()[:1], model="tiny-clip", priority="high")
    assert one.pool == "cpu"
    np.testing.assert_allclose(one.embeddings, image_rows[:1], atol=1e-5)
    cosines = image_rows @ text_rows[0]
    ranked = await handle.rerank_images.remote(TEXTS[0], files(), model="tiny-clip", top_n=3)
    assert [h.index for h in ranked.results] == list(np.argsort(-cosines, kind="stable")[:3])
    similar = await handle.similarity_images.remote(TEXTS[0], files(), model="tiny-clip")
    np.testing.assert_allclose(similar.scores, cosines, atol=1e-5)


def test_hostile_images_are_refused_and_the_app_goes_on(http, expected):
    for data, status in ((png_declaring(100_000, 100_000), 413), (b"GIF89a" + b"\0" * 9, 422),
                         (b"not an image", 415)):
        reply = http.post("/embed", content=codecs.pack({"images": [files()[0], data],
                                                         "model": "tiny-clip"}),
                          headers={"content-type": "application/msgpack"})
        assert reply.status_code == status, reply.content
        assert error_body(reply)["param"] == "images[1]"  # errors answer in JSON
    reply = http.post("/embed", json={"images": [data_url(files()[0])], "model": "minilm"})
    assert reply.status_code == 422
    reply = http.post("/embed", json={"images": [data_url(files()[0])], "model": "tiny-clip"})
    np.testing.assert_allclose(reply.json()["embeddings"], expected[1][:1], atol=1e-5)
