"""A pool replica's Ray-free half: its work (``replica``: jobs in, results out, per-model
queues, leases, stats), the models it holds (``model_set``: loads, load states, the memory
budget, pins, evictions, the cache in front; ``memory_budget``: the arithmetic;
``load_queue``: loads one at a time; ``holder``: a loaded model's holder), the replica
called in process (``dispatcher``: ``in_process`` and the unit tests), continuous batching
(``batching`` over ``aging_queue``, also used by the ingress for its pool calls), worker
threads (``worker_slots``), one batch of mixed jobs (``mixed_batch``), images decoded
before the queue (``image_prep``) and the local hop over a Unix socket (``local_hop``).

May import ``blitz.hop_messages``, ``blitz.loading``, ``blitz.encoders``, ``blitz.settings``,
``blitz.sources``, ``blitz.runtime`` and the top-level leaf modules; never ``blitz.bulk``,
the ingress or HTTP.
"""
