"""TEI's gRPC API (``tei.v1``) through Serve's own gRPC proxy on the shared instance (its
``grpc_options`` are serve_config.yaml's), with a real gRPC client: the same vectors,
scores and tokens as HTTP, errors as status codes, metrics per method, and a listener on
loopback only."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from blitz.grpc_api import rpc_table
from blitz.grpc_api import tei_pb2 as pb
from tests.integration.conftest import APP
from tests.integration.test_embed_http import cosines
from tests.metrics_scrape import metrics_url, scrape_until, total

TEXTS = ["A man is eating food.", "Vectors power search, fast.", "naïve café — 東京"]


@pytest.fixture
def channel(blitz_app, grpc_port):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        yield channel


def call(channel, method: str, request, model: str | None = None, **kwargs):
    metadata = (("application", APP),) + ((("model", model),) if model else ())
    return rpc_table.client_method(channel, method)(request, metadata=metadata, timeout=120,
                                                   **kwargs)


def http_rows(http, texts: list[str], model: str) -> np.ndarray:
    r = http.post("/embed", json={"texts": texts, "model": model},
                  headers={"accept": "application/json"})
    assert r.status_code == 200, r.text
    return np.array(r.json()["embeddings"], dtype=np.float32)


def test_embed_and_its_stream_give_http_vectors(channel, http):
    expected = http_rows(http, TEXTS, "minilm")
    one = call(channel, "Embed", pb.EmbedRequest(inputs=TEXTS[0], truncate=True), "minilm")
    # the same vector whatever it was batched with, to the guarantee (docs/cpu-backends.md):
    # torch fp32 alone or padded beside others differs in the last bits, and whether the
    # HTTP request's three texts share a call depends on the machine's calibrated call cost
    assert cosines(np.array([one.embeddings], dtype=np.float32), expected[:1]).min() >= 0.99999
    assert one.metadata.compute_tokens > 0

    replies = list(call(channel, "EmbedStream",
                        iter([pb.EmbedRequest(inputs=t, truncate=True) for t in TEXTS]),
                        "minilm"))
    streamed = np.array([r.embeddings for r in replies], dtype=np.float32)
    assert cosines(streamed, expected).min() >= 0.99999  # batched with each other now
    default = call(channel, "Embed", pb.EmbedRequest(inputs=TEXTS[0]))  # the default model
    assert np.array_equal(np.array(default.embeddings, dtype=np.float32),
                          np.array(one.embeddings, dtype=np.float32))  # both alone


def test_rerank_tokenize_and_info(channel, http):
    docs = ["food", "a man eats", "stock prices"]
    expected = http.post("/rerank", json={"query": TEXTS[0], "documents": docs,
                                          "model": "tiny-ce"}).json()
    reply = call(channel, "Rerank", pb.RerankRequest(query=TEXTS[0], texts=docs,
                                                     truncate=True), "tiny-ce")
    assert [r.index for r in reply.ranks] == [hit["index"] for hit in expected["results"]]
    assert np.allclose([r.score for r in reply.ranks],
                       [hit["relevance_score"] for hit in expected["results"]], atol=1e-6)

    tokens = call(channel, "Tokenize", pb.EncodeRequest(inputs=TEXTS[2],
                                                        add_special_tokens=True), "minilm")
    over_http = http.post("/tokenize", json={"inputs": TEXTS[2], "model": "minilm",
                                             "offsets": "bytes"}).json()[0]
    assert [(t.id, t.text, t.special) for t in tokens.tokens] == [
        (t["id"], t["text"], t["special"]) for t in over_http]
    assert [t.start for t in tokens.tokens if not t.special] == [
        t["start"] for t in over_http if not t["special"]]
    text = call(channel, "Decode", pb.DecodeRequest(ids=[t.id for t in tokens.tokens],
                                                    skip_special_tokens=True), "minilm")
    assert text.text == http.post("/decode", json={
        "ids": [t.id for t in tokens.tokens], "model": "minilm"}).json()[0]

    info = call(channel, "Info", pb.InfoRequest())
    assert (info.model_id, info.model_type, info.max_input_length) == (
        "minilm", pb.MODEL_TYPE_EMBEDDING, 256)


def test_errors_are_status_codes_with_blitz_messages(channel):
    with pytest.raises(grpc.RpcError) as unknown:
        call(channel, "Embed", pb.EmbedRequest(inputs="a"), "no-such-model")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in unknown.value.details()
    assert ("x-blitz-error", "model_not_found") in tuple(unknown.value.trailing_metadata())
    with pytest.raises(grpc.RpcError) as long:
        call(channel, "Embed", pb.EmbedRequest(inputs="word " * 20_000), "minilm")
    assert long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as broken:
        call(channel, "Embed", pb.EmbedRequest(inputs="a"), "broken")
    assert broken.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # 424: it cannot load


def test_metrics_count_each_method(channel):
    call(channel, "Embed", pb.EmbedRequest(inputs="counted", truncate=True), "minilm")

    def counted(samples) -> bool:
        ours = [s for s in samples if s.labels.get("application") == APP]
        return total(ours, "ray_blitz_requests_total", route="/tei.v1.Embed/Embed",
                     model="minilm", status="200") >= 1

    scrape_until(metrics_url(), counted)


def test_the_grpc_port_listens_on_loopback_only(blitz_app, grpc_port):
    """Serve binds its gRPC server to every interface; deployments/bind_addresses.py keeps it on
    the HTTP host (127.0.0.1 here)."""
    listening = listeners(grpc_port)
    assert listening, f"nothing listens on {grpc_port}"
    assert all((getattr(a, "ipv4_mapped", None) or a).is_loopback for a in listening), listening


def listeners(port: int) -> set:
    """The local addresses with a TCP socket listening on ``port`` (/proc/net/tcp{,6})."""
    import ipaddress

    found = set()
    for name, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/net/{name}") as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port:
                    continue
                raw = bytes.fromhex(address)
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
                found.add(ipaddress.ip_address(raw))
    return found
