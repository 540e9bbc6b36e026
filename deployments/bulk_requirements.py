"""Whether the ``bulk`` extra (Ray Data, pandas, pyarrow) is installed: the serving
install leaves it out, so ``blitz embed`` and ``embed_dataset`` say what to install
instead of failing with an ImportError from inside Ray."""

from __future__ import annotations

BULK_EXTRA_MISSING = (
    "blitz embed needs Ray Data, which the serving install leaves out (it brings pandas, "
    "which every Serve process would then import): install the bulk extra with "
    "`bash scripts/install.sh bulk` or `pip install -e '.[bulk]'`")


def require_ray_data() -> None:
    """Raise ``RuntimeError`` saying which extra to install when Ray Data cannot import."""
    try:
        import ray.data  # noqa: F401
    except ImportError as exc:  # pandas or pyarrow missing: the bulk extra is not installed
        raise RuntimeError(f"{BULK_EXTRA_MISSING} ({exc})") from exc
