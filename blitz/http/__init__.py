"""The HTTP API over the ingress's service: Starlette routes (``api``), the one middleware
(``middleware``), requests whose client left (``disconnect``) and response classes
(``responses``).

May import ``blitz.ingress`` and every floor below it; only ``blitz.cli`` and
``blitz.client`` sit above it.
"""
