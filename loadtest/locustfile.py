"""Distributed load with Locust, on the same corpus, APIs and reply checks as ``loadtest``.

One machine::

    locust -f loadtest/locustfile.py --headless -u 32 -r 8 -t 60s \\
        --host http://127.0.0.1:8000 --embed-api native-msgpack --texts-per-request 1

Many machines: start ``locust -f loadtest/locustfile.py --master --expect-workers N ...``
and ``locust -f loadtest/locustfile.py --worker --master-host HOST`` on each load box.

Options (each also an environment variable): ``--embed-api`` (``LOCUST_EMBED_API``,
default native-msgpack), ``--embed-model`` (``LOCUST_EMBED_MODEL``, minilm),
``--texts-per-request`` (``LOCUST_TEXTS_PER_REQUEST``, 1), ``--embed-api-key``
(``LOCUST_EMBED_API_KEY``), ``--embed-dimension`` (``LOCUST_EMBED_DIMENSION``; 0 means
"whatever the first reply has"), ``--corpus-seed`` (``LOCUST_CORPUS_SEED``, 0).

Users wait for each reply and send the next request at once (closed loop), so ``-u`` is
the concurrency. Failures are named by the same kinds as the ``loadtest`` reports
(``http_503``, ``verify_count``, ``exception_ConnectionRefusedError``...); embeddings/s is
requests/s times ``--texts-per-request``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from locust import FastHttpUser, constant, events, task

from loadtest.apis import API_NAMES, Api, auth_headers, get_api
from loadtest.corpus import batched, sentences
from loadtest.verify import (
    ReplyChecker,
    VerificationError,
    exception_kind,
    http_error_kind,
)

TEXT_POOL_SIZE = 8192
_texts_by_seed: dict[int, list[str]] = {}


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    parser.add_argument("--embed-api", choices=API_NAMES, default="native-msgpack",
                        env_var="LOCUST_EMBED_API", help="request/reply format")
    parser.add_argument("--embed-model", default="minilm", env_var="LOCUST_EMBED_MODEL",
                        help="model name sent with each request")
    parser.add_argument("--texts-per-request", type=int, default=1,
                        env_var="LOCUST_TEXTS_PER_REQUEST", help="corpus sentences per request")
    parser.add_argument("--embed-api-key", default="", env_var="LOCUST_EMBED_API_KEY",
                        help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--embed-dimension", type=int, default=0,
                        env_var="LOCUST_EMBED_DIMENSION", help="expected size; 0: learn it")
    parser.add_argument("--corpus-seed", type=int, default=0, env_var="LOCUST_CORPUS_SEED",
                        help="corpus seed")


def _corpus(seed: int) -> list[str]:
    if seed not in _texts_by_seed:
        _texts_by_seed[seed] = sentences(TEXT_POOL_SIZE, seed)
    return _texts_by_seed[seed]


class EmbeddingUser(FastHttpUser):
    wait_time = constant(0)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.api: Api = get_api(getattr(options, "embed_api", "native-msgpack"))
        self.model: str = getattr(options, "embed_model", "minilm")
        self.per_request: int = getattr(options, "texts_per_request", 1)
        self.checker = ReplyChecker(getattr(options, "embed_dimension", 0) or None)
        self.auth = auth_headers(getattr(options, "embed_api_key", "") or None)
        texts = _corpus(getattr(options, "corpus_seed", 0))
        start = random.randrange(len(texts))  # users spread over the corpus
        self.batches: Iterator[list[str]] = batched(
            itertools.islice(itertools.cycle(texts), start, None), self.per_request)
        self.label = f"{self.api.path} [{self.api.name} x{self.per_request}]"

    @task
    def embed(self) -> None:
        texts = next(self.batches)
        request = self.api.request(texts, self.model)
        with self.client.post(request.path, data=request.body,
                              headers={**request.headers, **self.auth}, name=self.label,
                              catch_response=True) as response:
            if not response.status_code:  # no HTTP answer: connection refused, reset...
                error = getattr(response, "error", None)
                response.failure(exception_kind(error) if error else "exception_NoResponse")
                return
            if response.status_code != 200:
                response.failure(http_error_kind(response.status_code))
                return
            try:
                reply = self.api.parse(response.content or b"", response.headers or {})
                self.checker.check(reply.embeddings, len(texts))
            except VerificationError as exc:
                response.failure(exc.kind)
                return
            response.success()
