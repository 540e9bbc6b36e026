"""A real S3-compatible server (moto) on 127.0.0.1 for a test, with the environment that
points boto3 and s3fs at it (credentials ``testing``, region us-east-1)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.ports import free_port


@contextlib.contextmanager
def moto_s3(monkeypatch: Any, *buckets: str) -> Iterator[tuple[Any, Any]]:
    """A moto server with ``buckets`` made; yields (the server, a boto3 client of it);
    stopped afterwards."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    client = boto3.client("s3")
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
    try:
        yield server, client
    finally:
        server.stop()
