"""The HTTP API over the ingress's services: the routes (``api``), the peers' own routes,
Cohere's and TEI's ``POST /`` (``peers``), images on the routes texts use (``images``),
``/embed_hybrid`` (``hybrid``), the model admin routes (``admin``), the request bodies
(``bodies``) and what they say of long inputs (``long_inputs``), the reply bodies
(``reply_bodies``), the one middleware (``middleware``), requests whose client left
(``disconnect``), response classes (``responses``) and the OpenAPI document and its page
(``openapi``)."""
