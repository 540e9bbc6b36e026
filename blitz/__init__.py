"""Blitz: a multi-model embedding and reranking server; this package is its Ray-free library.

Packages are the architecture, in floors: a module imports its own package, lower floors
and the top-level leaf modules, never a floor above (tests/unit/test_layering.py holds the
rule, ``FLOORS``). Each package's docstring says what it holds, module by module; the map
in README.md ("Layout") and docs/architecture.md is generated from them (``python -m
blitz.map``).
"""
