"""Load generator and benchmarks for Blitz (and any OpenAI-compatible embedding server).

Modules, one concern each: ``corpus`` (deterministic sentences), ``apis`` (requests and
reply parsing per API), ``verify`` (reply checks, error kinds), ``runner`` (the asyncio
load generator), ``stats`` and ``report`` (numbers and tables), ``results`` (the results files
BENCHMARKS.md is rendered from) and ``render`` (its tables and charts), ``plots``, ``inprocess``
(the encode ceiling), ``formats`` (wire formats), ``naive_server`` (the baseline) and
``locustfile`` (distributed load). Run ``python -m loadtest --help``.
"""
