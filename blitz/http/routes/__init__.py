"""The HTTP routes, declared once: ``table`` lists every route (path, method, body model,
the service call, reply formats, summary) and feeds the router (``blitz.http.api``), the
OpenAPI document (``blitz.http.openapi``), the handle methods (``deployments/
handle_methods.py``) and the client's check (``tests/unit/test_route_table.py``).

Routes are plain functions ``route(kit, request, payload)`` over ``kit`` (body reading,
the model id, the reply format, the request record and id), cut by API family: Blitz's own
(``blitz_api``), Hugging Face TEI's (``tei``), OpenAI's (``openai``), Infinity's
(``infinity``) and Cohere's (``cohere``); ``images`` holds the image variants of the routes
texts use, ``parts`` the variants (and Voyage's route) for documents of text and image
parts, ``late_interaction`` the multi-vector route, late chunking's variants and Voyage's
contextualized embeddings, ``batches`` OpenAI's Files and Batches API. A route that two APIs share lives with the family named first in its summary.
"""
