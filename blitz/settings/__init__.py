"""Every setting, typed, in one place: serve_config.yaml's ``args`` (``config``), one
replica pool's settings and the base every section shares (``pool_settings``), the model
registry (``registry``: ``ModelSpec`` and where its weights come from), every model kind
declared once (``kinds``: what each takes, produces and serves), Serve's deployment
options as Blitz passes them (``deployment_options``), ``auto`` sizes (``sizing``), image
limits and URL fetching (``images``), the bulk job's settings (``bulk``), the batch API's (``batches``), and the settings
tables of docs/configuration.md generated from them (``doc``)."""
