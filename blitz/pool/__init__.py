"""A pool replica's Ray-free half: its logic (``replica``: jobs in, results out, per-model
queues, leases, loads, stats), continuous batching (``batching``, also used by the ingress
for its pool calls) over priority levels that age (``aging_queue``), worker threads
(``worker_slots``), model loads one at a time (``load_queue``), what a model needs in
memory and which resident models a new one evicts (``memory_budget``), one batch of mixed
jobs (``mixed_batch``), images made ready before their model call (``image_prep``), the
loaded model's holder (``holder``) and the local hop over a Unix socket (``local_hop``)."""
