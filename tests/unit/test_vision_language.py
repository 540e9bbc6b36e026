"""Vision-language embedders and rerankers (kinds vl-embedding and vl-reranker) on tiny
random Qwen2-VL and Qwen3-VL models built from configs (``tests.tiny_vl``): every vector
and score equals the model card's formula computed with transformers directly
(``tests.tiny_vl.reference_*``), for texts, images and mixes, alone and in any batch, with
images of several sizes and micro-batches of any size; over-long inputs lose text, never an
image; and every request shape (Blitz's ``parts``, vLLM's ``messages``, Jina's objects,
Cohere's ``inputs``, Voyage's) gives the same vectors through the HTTP API in process."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from blitz import codecs
from blitz.errors import InputTooLong, InvalidValue
from blitz.hop_messages import PartsJob
from blitz.ingress.parts import ImageRef, parts_of
from blitz.ingress.routing import choose_pool
from blitz.settings.config import BlitzSettings, RoutingSettings
from blitz.settings.registry import ModelSpec
from blitz.vision_language.embedder import VlEmbedder, open_vl_embedder
from blitz.vision_language.reranker import open_vl_reranker
from blitz.vision_language.visual import ImageShape, read_image_shape, smart_resize
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_vision import random_images
from tests.tiny_vl import (
    build_tiny_vl,
    reference_embedding,
    reference_jina_m0,
    reference_qwen3vl_rerank,
)

SIZES = [(40, 28), (96, 64), (30, 200), (200, 120)]


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def pictures() -> list[Image.Image]:
    # what the server decodes: the files' own pixels, as RGB
    return [Image.open(io.BytesIO(png(p))).convert("RGB") for p in random_images(5, SIZES)]


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen2_vl"])
def tiny(request, tmp_path_factory):
    family = request.param
    head = "jina-m0" if family == "qwen2_vl" else None
    return family, build_tiny_vl(tmp_path_factory.mktemp(family), family, seed=3, head=head)


def embedder(path, budget: int = 4096, **spec) -> VlEmbedder:
    return open_vl_embedder(ModelSpec(id="vl", source=str(path), kind="vl-embedding", **spec),
                            path, "cpu", torch.float32, budget)


def documents(pictures):
    """Texts, images and mixes, and the same as the server receives them (files)."""
    given = [["the quick brown fox"], [pictures[0]], [pictures[1]],
             ["a red cat", pictures[2], "the dog"], [pictures[3], "paris"], ["b", "c"]]
    sent = [tuple(p if isinstance(p, str) else png(p) for p in doc) for doc in given]
    return given, sent


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# ---- the model cards' formulas ---------------------------------------------------------

@pytest.mark.parametrize("budget", [4096, 40])  # one call, or one document a call
def test_vectors_equal_the_model_card_alone_and_in_any_batch(tiny, pictures, budget):
    _, path = tiny
    given, sent = documents(pictures)
    expected = np.stack([reference_embedding(path, doc) for doc in given])
    model = embedder(path, budget)
    batched = model.embed_parts(sent, normalize=True).values
    assert cosines(batched, expected).min() >= 0.9999
    alone = np.stack([model.embed_parts([doc], normalize=True).values[0] for doc in sent])
    assert cosines(alone, expected).min() >= 0.9999
    reordered = model.embed_parts(sent[::-1], normalize=True).values[::-1]
    assert cosines(reordered, expected).min() >= 0.9999


def test_instruction_texts_and_images_calls(tiny, pictures):
    _, path = tiny
    model = embedder(path, vl_instruction="Find the photo")
    model.warmup()  # a text and an image through the model: nothing left to set up lazily
    got = model.embed_parts([("a red cat",)], normalize=True,
                            instruction="Describe the picture").values[0]
    want = reference_embedding(path, ["a red cat"], instruction="Describe the picture")
    assert float(got @ want) >= 0.9999
    # the spec's instruction when a request sends none, a full stop added as the card does
    got = model.embed(["a red cat"], normalize=True).values[0]
    assert float(got @ reference_embedding(path, ["a red cat"],
                                           instruction="Find the photo")) >= 0.9999
    got = model.embed_image_bytes([png(pictures[1])], normalize=True).values[0]
    assert float(got @ reference_embedding(path, [pictures[1]], instruction="Find the photo")) \
        >= 0.9999
    raw = model.embed_parts([("a red cat",)], normalize=False).values[0]
    assert not np.isclose(np.linalg.norm(raw), 1.0)


def test_padding_side_of_the_tokenizer_changes_nothing(tmp_path, pictures):
    path = build_tiny_vl(tmp_path / "left", "qwen3_vl", seed=4, padding_side="left")
    given, sent = documents(pictures)
    expected = np.stack([reference_embedding(path, doc) for doc in given])
    assert cosines(embedder(path, 60).embed_parts(sent, normalize=True).values,
                   expected).min() >= 0.9999


def test_the_qwen3_vl_reranker_equals_its_model_card(tmp_path, pictures):
    path = build_tiny_vl(tmp_path / "r", "qwen3_vl", seed=7)
    model = open_vl_reranker(ModelSpec(id="r", source=str(path), kind="vl-reranker"), path,
                             "cpu", torch.float32, 64)
    model.warmup()
    query = ["what is paris"]
    docs = [["the capital of france"], [pictures[0]], ["a cat", pictures[1]], [pictures[3]]]
    want = [reference_qwen3vl_rerank(path, query, d, images_first=False) for d in docs]
    sent = [tuple(p if isinstance(p, str) else png(p) for p in d) for d in docs]
    got = model.score_parts(tuple(query), sent).values
    np.testing.assert_allclose(got, want, atol=2e-5)
    alone = [model.score_parts(tuple(query), [d]).values[0] for d in sent]
    np.testing.assert_allclose(alone, want, atol=2e-5)
    # an image query; the instruction; the text call
    got = model.score_parts((png(pictures[2]),), sent[:2], instruction="Match it").values
    want = [reference_qwen3vl_rerank(path, [pictures[2]], d, instruction="Match it",
                                     images_first=False) for d in docs[:2]]
    np.testing.assert_allclose(got, want, atol=2e-5)
    text = model.score("what is paris", ["the capital of france"]).values[0]
    assert text == pytest.approx(reference_qwen3vl_rerank(path, query, docs[0]), abs=2e-5)


def test_the_jina_m0_reranker_equals_its_model_card(tmp_path, pictures):
    path = build_tiny_vl(tmp_path / "j", "qwen2_vl", seed=8, head="jina-m0")
    spec = ModelSpec(id="j", source=str(path), kind="vl-reranker", reranker_style="jina-m0")
    model = open_vl_reranker(spec, path, "cpu", torch.float32, 64)
    docs = ["the capital of france", pictures[0], pictures[1], "a cat"]
    want = [reference_jina_m0(path, "what is paris", d) for d in docs]
    sent = [(d if isinstance(d, str) else png(d),) for d in docs]
    np.testing.assert_allclose(model.score_parts(("what is paris",), sent).values, want,
                               atol=2e-5)
    want = [reference_jina_m0(path, pictures[2], d) for d in docs[:2]]
    np.testing.assert_allclose(model.score_parts((png(pictures[2]),), sent[:2]).values, want,
                               atol=2e-5)


# ---- lengths, images, special tokens ---------------------------------------------------

def test_an_over_long_input_loses_its_texts_end_never_an_image(tiny, pictures):
    _, path = tiny
    model = embedder(path)
    long_text = " ".join(["fox"] * 80)
    whole = model.sequences([model.prompt(model.parts(("a cat", png(pictures[0]), long_text),
                                                      0, cut=0), None)], True)[0]
    model.max_seq_length = len(whole) - 30
    cut = model.sequences([model.prompt(model.parts(("a cat", png(pictures[0]), long_text),
                                                    0, cut=0), None)], True)[0]
    assert len(cut) == model.max_seq_length
    assert cut.ids.count(model.builder.image_pad) == whole.ids.count(model.builder.image_pad)
    assert cut.ids[-8:] == whole.ids[-8:]  # the template's end stays
    with pytest.raises(InputTooLong):
        model.embed_parts([("a cat", png(pictures[0]), long_text)], normalize=True,
                          truncate=False)
    model.max_seq_length = whole.ids.count(model.builder.image_pad)  # the image alone is over
    with pytest.raises(InputTooLong, match="fewer or smaller images"):
        model.embed_parts([("a cat", png(pictures[0]))], normalize=True)


def test_a_text_that_spells_a_special_token_stays_text(tiny):
    _, path = tiny
    model = embedder(path)
    tokenizer = model.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    plain = model.sequences([model.prompt(model.parts(("hello",), 0), None)], True)[0]
    sneaky = model.sequences([model.prompt(model.parts(("hello <|im_end|>",), 0), None)],
                             True)[0]
    assert sneaky.ids.count(end) == plain.ids.count(end)  # the template's own, no more


def test_resize_rule_equals_the_image_processor(tiny, pictures):
    _, path = tiny
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref

    shape = read_image_shape(path)
    for height in (1, 13, 28, 29, 57, 333, 1000, 4000):
        for width in (14, 40, 100, 999):
            if max(height, width) / min(height, width) > 200:
                continue
            assert smart_resize(height, width, shape.factor, shape.min_pixels,
                                shape.max_pixels) == ref(height, width, shape.factor,
                                                         shape.min_pixels, shape.max_pixels)
    model = embedder(path)
    for picture in pictures:
        assert model.prepare_part(picture).tokens == shape.tokens(*picture.size)
    capped = ImageShape().capped(64, 4)
    assert capped.tokens(4000, 3000) <= 64 and capped.tokens(10, 10) >= 4


def test_parts_in_every_shape():
    url = {"url": "data:x"}
    assert parts_of("a text", "input") == ["a text"]
    assert parts_of({"text": "t"}, "input") == ["t"]
    assert parts_of({"image": "b64"}, "input") == [ImageRef("b64")]
    assert parts_of({"content": [{"type": "text", "text": "t"},
                                 {"type": "image_url", "image_url": url}]}, "i") == \
        ["t", ImageRef("data:x")]
    assert parts_of([{"type": "image_base64", "image_base64": "data:y"},
                     {"type": "image_url", "image_url": "http://h/x.png"}, b"png"], "i") == \
        [ImageRef("data:y"), ImageRef("http://h/x.png"), ImageRef(b"png")]
    for bad, says in (({"type": "video_url"}, "video_url"), ({"audio": 1}, "audio"),
                      ([["nested"]], "list inside"), (3, "not int"),
                      ({"type": "text", "text": 3}, "must be a string")):
        with pytest.raises(InvalidValue, match=says):
            parts_of(bad, "input[0]")


def test_routing_and_the_job(tiny):
    policy = RoutingSettings(gpu_min_images=4)
    assert choose_pool("vl-embedding", 8, {"cpu", "gpu"}, {"cpu", "gpu"}, policy,
                       images=True).pool == "gpu"
    assert choose_pool("vl-embedding", 2, {"cpu", "gpu"}, {"cpu", "gpu"}, policy,
                       images=True).pool == "cpu"
    assert choose_pool("vl-reranker", 1, {"cpu", "gpu"}, {"cpu", "gpu"}, policy).reason == "kind"
    job = PartsJob([("a", b"img"), ("b",)], query=(b"q",))
    assert len(job) == 2 and job.encoded_images == 2


# ---- the HTTP API, in process ----------------------------------------------------------

def settings_for(path, jina_path=None) -> BlitzSettings:
    models = [{"id": "vl", "source": str(path), "kind": "vl-embedding",
               "prompts": {"query": "Find the matching picture", "search_query": "Q."}},
              {"id": "vlr", "source": str(path), "kind": "vl-reranker"},
              {"id": "emb", "source": "fake:8"}]
    if jina_path is not None:
        models.append({"id": "jina", "source": str(jina_path), "kind": "vl-reranker",
                       "reranker_style": "jina-m0"})
    return BlitzSettings.from_args({
        "models": models, "default_model": "vl", "cpu_pool": {"max_batch_size": 2},
        "limits": {"max_visual_tokens_per_request": 200},
        "images": {"max_bytes": 200_000}})


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return build_tiny_vl(tmp_path_factory.mktemp("api"), "qwen3_vl", seed=11)


def rows(reply, key: str = "embeddings") -> np.ndarray:
    assert reply.status_code == 200, reply.text
    body = reply.json()
    if key == "data":
        return np.asarray([d["embedding"] for d in body["data"]], dtype=np.float32)
    return np.asarray(body[key] if key != "float" else body["embeddings"]["float"],
                      dtype=np.float32)


async def test_every_request_shape_gives_the_model_card_vectors(qwen3, pictures):
    image, caption = png(pictures[1]), "a red cat"
    want = reference_embedding(qwen3, [caption, pictures[1]])
    want_image = reference_embedding(qwen3, [pictures[1]])
    url = data_url(image)
    async with api_client(settings_for(qwen3)) as client:
        got = rows(await client.post("/embed", json={
            "parts": [[caption, {"image": url}], [{"type": "image_url",
                                                   "image_url": {"url": url}}]]}))
        assert cosines(got, np.stack([want, want_image])).min() >= 0.9999
        reply = await client.post("/embed", content=codecs.pack(
            {"parts": [[caption, {"image": image}]], "dimensions": 16}),
            headers={"content-type": "application/msgpack", "accept": "application/msgpack"})
        assert reply.status_code == 200, reply.text
        cut = codecs.unpack(reply.content)["embeddings"]
        assert cut.shape == (1, 16) and cosines(cut, want[None, :16]).min() >= 0.9999
        # vLLM's chat embeddings: the system turn is the instruction
        got = rows(await client.post("/v1/embeddings", json={
            "model": "vl", "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Find it"}]},
                {"role": "user", "content": [{"type": "text", "text": caption},
                                             {"type": "image_url", "image_url": {"url": url}}]},
                {"role": "assistant", "content": [{"type": "text", "text": ""}]}],
            "continue_final_message": True, "input": ""}), "data")
        assert float(got[0] @ reference_embedding(qwen3, [caption, pictures[1]],
                                                  instruction="Find it")) >= 0.9999
        # Jina's input objects: one vector each
        got = rows(await client.post("/v1/embeddings", json={
            "input": [{"text": caption}, {"image": base64.b64encode(image).decode()}]}),
            "data")
        assert cosines(got, np.stack([reference_embedding(qwen3, [caption]), want_image])
                       ).min() >= 0.9999
        # Cohere's v2: inputs of content, or images; input_type picks the model's prompt
        reply = await client.post("/v2/embed", json={
            "model": "vl", "input_type": "search_document", "embedding_types": ["float",
                                                                                "int8"],
            "inputs": [{"content": [{"type": "text", "text": caption},
                                    {"type": "image_url", "image_url": {"url": url}}]}]})
        assert cosines(rows(reply, "float"), want[None]).min() >= 0.9999
        assert reply.json()["meta"]["billed_units"]["images"] == 1
        reply = await client.post("/v2/embed", json={"model": "vl", "input_type": "image",
                                                     "images": [url]})
        assert cosines(rows(reply, "float"), want_image[None]).min() >= 0.9999
        # Voyage's multimodal embeddings, its usage and base64 rows
        reply = await client.post("/v1/multimodalembeddings", json={
            "model": "vl", "input_type": "query", "encoding_format": "base64",
            "inputs": [{"content": [{"type": "text", "text": caption},
                                    {"type": "image_base64", "image_base64": url}]}]})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        row = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4")
        want_query = reference_embedding(qwen3, [caption, pictures[1]],
                                         instruction="Find the matching picture")
        assert float(row @ want_query) >= 0.9999
        usage = body["usage"]
        assert usage["image_pixels"] == pictures[1].size[0] * pictures[1].size[1]
        assert 0 < usage["text_tokens"] < usage["total_tokens"]


async def test_mixed_reranks_on_every_rerank_route(qwen3, pictures, tmp_path):
    jina = build_tiny_vl(tmp_path / "jina", "qwen2_vl", seed=2, head="jina-m0")
    docs = [{"text": "the capital of france"}, {"image": data_url(png(pictures[0]))},
            {"content": [{"type": "text", "text": "a cat"},
                         {"type": "image_url", "image_url": {"url": data_url(png(pictures[1]))}}]}]
    want = np.array([
        reference_qwen3vl_rerank(qwen3, ["paris"], ["the capital of france"]),
        reference_qwen3vl_rerank(qwen3, ["paris"], [pictures[0]]),
        reference_qwen3vl_rerank(qwen3, ["paris"], ["a cat", pictures[1]], images_first=False)])
    order = list(np.argsort(-want, kind="stable"))
    async with api_client(settings_for(qwen3, jina)) as client:
        body = {"model": "vlr", "query": "paris", "documents": docs}
        for path, key, score in (("/rerank", "results", "relevance_score"),
                                 ("/v1/rerank", "results", "relevance_score"),
                                 ("/v2/rerank", "results", "relevance_score")):
            reply = await client.post(path, json=body)
            assert reply.status_code == 200, (path, reply.text)
            hits = reply.json()[key]
            assert [h["index"] for h in hits] == order, path
            np.testing.assert_allclose([h[score] for h in hits], want[order], atol=2e-5)
        reply = await client.post("/rerank", json={**body, "model": "jina", "top_n": 1})
        jina_want = [reference_jina_m0(jina, "paris", "the capital of france"),
                     reference_jina_m0(jina, "paris", pictures[0])]
        hits = reply.json()["results"]
        assert len(hits) == 1 and hits[0]["relevance_score"] == pytest.approx(
            max(jina_want[:2] + [hits[0]["relevance_score"]]), abs=2e-5)
        # an embedder reranks by cosine
        reply = await client.post("/rerank", json={**body, "model": "vl"})
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["results"]) == 3


async def test_wrong_parts_are_refused_naming_what_to_fix(qwen3, pictures):
    big = png(random_images(1, [(200, 200)])[0])
    async with api_client(settings_for(qwen3)) as client:
        cases = [
            ({"parts": [["a", {"image": "not base64!"}]]}, 422, "input[0][1]"),
            ({"parts": [["a", {"image": data_url(b"GIF89a" + b"\0" * 20)}]]}, 422,
             "input[0][1]"),
            ({"parts": [[]]}, 422, "no part"),
            ({"parts": [["  "]]}, 422, "empty text"),
            ({"parts": [[{"image": data_url(big)}]] * 20}, 413,
             "max_visual_tokens_per_request"),
            ({"parts": [["a"]], "model": "emb"}, 422, "vl-embedding"),
            ({"messages": [{"role": "assistant", "content": "hi"},
                           {"role": "user", "content": "a"}]}, 422, "assistant"),
        ]
        for body, status, says in cases:
            path = "/v1/embeddings" if "messages" in body else "/embed"
            reply = await client.post(path, json=body)
            assert reply.status_code == status, (body, reply.text)
            error = error_body(reply)
            assert says in error["message"] + str(error.get("param")), (says, reply.text)
        reply = await client.post("/rerank", json={"model": "emb", "query": "q",
                                                   "documents": [{"image": data_url(big)}]})
        assert reply.status_code == 422 and "vl-reranker" in reply.text
