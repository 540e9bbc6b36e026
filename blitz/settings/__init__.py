"""Every setting, typed, in one place: serve_config.yaml's ``args`` (``config``), the model
registry (``registry``: ``ModelSpec`` and where its weights come from), Serve's deployment
options as Blitz passes them (``deployment_options``), ``auto`` sizes (``sizing``), the bulk
job's settings (``bulk``), and the settings tables of docs/configuration.md generated from
them (``python -m blitz.settings.doc``).

May import ``blitz.sources``, ``blitz.runtime`` and the top-level leaf modules.
"""
