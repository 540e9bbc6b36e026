"""Multi-vector (late-interaction) outputs: one vector per token (ColBERT-style), and
what turns them into something a single-vector index can search.

Modules: ``muvera`` (MUVERA fixed-dimensional encodings and MaxSim).
"""
