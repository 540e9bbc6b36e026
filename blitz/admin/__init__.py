"""Models added, pinned, evicted and removed at run time, without a redeploy: the model
table every replica reads (``table``), the store it lives in (``store``), and how a
replica follows it (``watch``). Ray-free: the cluster's store is plugged in by
``deployments.model_store``."""
