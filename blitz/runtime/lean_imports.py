"""Keep what sentence-transformers imports but Blitz never calls out of a replica's memory.

sentence-transformers 5.x imports ``sklearn.metrics`` when it is imported (for
``util.similarity``'s sparse Manhattan distance and its evaluators), which brings
scikit-learn: measured on a 2-core machine, 13 MiB of an idle pool replica's PSS and
~0.65 s of importing sentence-transformers (docs/benchmarks-history.md, "Idle memory"),
for functions no replica calls. ``defer_sklearn_metrics()``, run
before sentence-transformers is first imported, puts a stand-in ``sklearn.metrics`` in
``sys.modules``: each name taken from it is a function that imports the real module on
its first call and hands the call over, so nothing is lost, only deferred. Importing
``sklearn.metrics`` by name later gets the real module. Nothing is deferred when
scikit-learn is already imported or not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

MODULE = "sklearn.metrics"
_lock = threading.Lock()


class _Deferred(types.ModuleType):
    """``sklearn.metrics`` until something calls into it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(real_module(), name)(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call


def real_module() -> types.ModuleType:
    """The real ``sklearn.metrics``, imported now if only the stand-in was there."""
    with _lock:
        if isinstance(sys.modules.get(MODULE), _Deferred):
            del sys.modules[MODULE]
        return importlib.import_module(MODULE)


def defer_sklearn_metrics() -> bool:
    """Put the stand-in in place; True if it was (False: scikit-learn already imported,
    or not installed)."""
    if "sklearn" in sys.modules or MODULE in sys.modules:
        return False
    if importlib.util.find_spec("sklearn") is None:
        return False
    stand_in = _Deferred(MODULE, "stand-in: imports the real module on first call")
    stand_in.__spec__ = importlib.util.spec_from_loader(MODULE, loader=None)
    sys.modules[MODULE] = stand_in
    return True


def is_deferred() -> bool:
    return isinstance(sys.modules.get(MODULE), _Deferred)
