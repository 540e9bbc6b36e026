"""Encoders: one contract (``base.Encoder``) and one backend per module.

``loading.load_encoder`` turns a ``ModelSpec`` into an encoder; ``models`` opens and
wraps sentence-transformers models; ``holder`` owns a loaded one inside a pool. This
package module imports only the contract, so any module here can be imported alone.
"""

from blitz.encoders.base import Encoded, Encoder

__all__ = ["Encoded", "Encoder"]
