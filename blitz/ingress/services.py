"""The ingress's services built in one place, for the app, the HTTP API and the tests.

``Services.build(settings, dispatcher)`` makes the request pipeline (``EmbeddingService``)
over a ``Dispatcher`` and the services beside it that share it and its tokenizers
(``TokenService``, ``OutputService``, ``ImageService``, ``PartsService``,
``LateInteractionService``); the fronts (HTTP, gRPC, the
handle) take them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from blitz.ingress.images import ImageService
from blitz.ingress.late_interaction import LateInteractionService
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.parts import PartsService
from blitz.ingress.service import Dispatcher, EmbeddingService, Observer, RouteObserver
from blitz.ingress.tokenizing import TokenService
from blitz.settings.config import BlitzSettings


@dataclass(frozen=True)
class Services:
    service: EmbeddingService  # /embed, /rerank: the request pipeline the others run through
    tokens: TokenService  # /tokenize, /decode; the tokenizers that count a request's tokens
    outputs: OutputService  # /embed_all, /embed_sparse, /embed_hybrid, /predict, /similarity
    images: ImageService  # a dual encoder's images
    parts: PartsService  # documents of text and image parts (vision-language models)
    late: LateInteractionService  # multi-vectors (ColBERT), late chunking

    @classmethod
    def build(cls, settings: BlitzSettings, dispatcher: Dispatcher, *,
              observer: Observer | None = None,
              route_observer: RouteObserver | None = None) -> Services:
        """The services over ``dispatcher``; ``observer`` hears of each finished request,
        ``route_observer`` of each routing decision (the metrics)."""
        return cls.of(EmbeddingService(settings, dispatcher, observer=observer,
                                       route_observer=route_observer))

    @classmethod
    def of(cls, service: Services | EmbeddingService, tokens: TokenService | None = None,
           outputs: OutputService | None = None, images: ImageService | None = None,
           parts: PartsService | None = None,
           late: LateInteractionService | None = None) -> Services:
        """``service`` when it is the services already; else the services around that
        ``EmbeddingService``, each one given used as it is."""
        if isinstance(service, Services):
            return service
        tokens = tokens or TokenService(service)
        outputs = outputs or OutputService(service, tokens)
        return cls(service, tokens, outputs, images or ImageService(service),
                   parts or PartsService(service), late or LateInteractionService(outputs))
