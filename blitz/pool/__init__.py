"""A pool replica's Ray-free half: its work (``replica``: jobs in, results out, per-model
queues, leases, stats), the models it holds (``model_set``: loads, load states, pins,
evictions and the cache in front), what a model needs in memory and which resident models
a new one evicts (``memory_budget``), model loads one at a time (``load_queue``), the
loaded model's holder (``holder``), the replica called in this process (``dispatcher``:
``in_process`` and the unit tests), continuous batching (``batching``, also used by the
ingress for its pool calls) over priority levels that age (``aging_queue``), worker
threads (``worker_slots``), one batch of mixed jobs (``mixed_batch``), images made ready
before their model call (``image_prep``) and the local hop over a Unix socket
(``local_hop``)."""
