"""Where a model's files come from and where they are kept: the on-disk model cache
(``model_cache``) and object-storage sources downloaded into it (``storage``)."""
