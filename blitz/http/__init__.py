"""The HTTP API over the ingress's services: the app (``api``: ``HttpApi``), its routes
declared once and cut by API family (``routes/``: the table, the request kit, Blitz's,
TEI's, OpenAI's, Infinity's and Cohere's routes, images), the request bodies
(``bodies``, ``long_inputs``), the reply bodies (``reply_bodies``), response classes
(``responses``), the one middleware (``middleware``), requests whose client left
(``disconnect``), requests made inside the server (``internal``: a batch's lines),
multipart uploads read as they arrive (``uploads``), the OpenAPI document and page
(``openapi``) and the admin API (``admin``).

May import ``blitz.ingress`` and every floor below it; only ``blitz.cli`` and
``blitz.client`` sit above it.
"""
