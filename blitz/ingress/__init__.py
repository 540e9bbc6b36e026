"""The ingress's request logic, free of Ray and of HTTP: the request pipeline and output
options (``service``), a request's cost budget (``limits``), long inputs and their chunks
(``long_inputs``), the vector cache (``vector_cache``), per-token, sparse and classifier
outputs (``other_outputs``), images embedded, reranked and scored against a text
(``images``), documents of text and image parts embedded and reranked by
vision-language models (``parts``), multi-vectors and late chunking
(``late_interaction``), ``/tokenize`` and ``/decode`` (``tokenizing``) on the models' tokenizers
(``tokenizers``), ``/ready``, ``/models`` and ``/info`` (``status``), which pool serves a
request (``routing``), why a pool replica waits for the cluster (``placement``), API keys
for every front (``keys``), the queue per pool and model in front of the pool calls
(``queues``) and the services built in one place for every front (``services``)."""
