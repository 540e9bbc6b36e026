"""A pool replica's Ray-free half: its logic (``replica``: jobs in, results out, per-model
queues, leases, loads, stats), continuous batching (``batching``, also used by the
ingress for its pool calls), worker threads (``worker_slots``), model loads one at a time
(``load_queue``), one batch of mixed jobs (``work``), the loaded model's holder (``holder``)
and the local hop over a Unix socket (``local_hop``).

May import ``blitz.hop_messages``, ``blitz.loading``, ``blitz.encoders``, ``blitz.settings``,
``blitz.sources``, ``blitz.runtime`` and the top-level leaf modules; never ``blitz.bulk``,
the ingress or HTTP.
"""
