"""Models added, pinned, evicted and removed at run time, without a redeploy: the model
table every replica reads (``table``), the store it lives in (``store``), which models the
admin API may add (``sources``), the table as the admin API shows it (``listing``), and how
a replica follows it (``watch``). Ray-free: the cluster's store is plugged in by
``deployments.model_admin``."""
