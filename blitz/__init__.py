"""Blitz: a multi-model embedding and reranking server; this package is its Ray-free library.

Packages are the architecture, in floors (lowest first); a module imports its own package,
lower floors and the top-level leaf modules (``errors``, ``timing``, ``codecs``), never a
floor above (tests/unit/test_layering.py holds the table):

    runtime                     the process a model runs in
    sources                     the model cache and object-storage sources
    settings                    typed settings, the model registry, sizes
    encoders                    the encoder contract and one backend per module
    loading, schemas            a ModelSpec to an Encoder; request and job models
    pool, bulk                  a pool replica's Ray-free half; the bulk job's
    ingress                     request logic: limits, routing, output options
    http                        the HTTP API
    cli, client                 the command line; the Python client
"""
