"""Encoders: one contract (``base.Encoder``) and one backend per module, plus what every
backend's vectors may go through (``postprocess``: ``dimensions`` and ``dtype``) and the
fixed texts backends are checked with (``probes``).

Nothing here loads a registered model: ``blitz.loading`` turns a ``ModelSpec`` into an
encoder, with ``models`` opening and wrapping sentence-transformers models for it. May
import ``blitz.settings``, ``blitz.sources``, ``blitz.runtime`` and the top-level leaf
modules; this package module imports nothing, so any module here can be imported alone.
"""
