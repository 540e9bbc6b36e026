"""Ray's token file kept to this user, whatever started Ray (issue 54).

Ray 2.60's `ray.init()` and `ray start --head` generate ``~/.ray/auth_token`` for a new
local cluster with the process's umask: 0644 as a rule, so any local user can read it and
run code as this one on the cluster. scripts/serve.sh creates it mode 600 before Ray
starts (scripts/ray_up.py, scripts/serve_run.py); a plain `serve run serve_config.yaml` on a
fresh machine leaves Ray to make it, and the first Blitz code that runs is this app's
builder. It makes the file private when Ray's start made it: changed no earlier than
``MADE_WITH_RAY_S`` before this Ray session began (Ray writes the token just before it
starts the node). An older file that others can read is someone's own choice: it gets a
WARNING only, as scripts/ray_up.py gives. Nothing is ever deleted or rewritten.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger("ray.serve")
MADE_WITH_RAY_S = 120.0


def default_token_path() -> Path:
    """Where Ray keeps a local cluster's token (authentication_token_setup's default)."""
    return Path.home() / ".ray" / "auth_token"


def keep_private(path: Path, session_started: float | None) -> str:
    """Make ``path`` mode 600 when others may read it, it is this user's and Ray's start
    made it (``session_started``: when this Ray session began, a Unix time; None:
    unknown). What was done: ``absent``, ``private`` (already), ``tightened`` or
    ``warned``."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return "absent"
    if not stat.st_mode & 0o077:
        return "private"
    made_by_this_start = (session_started is not None
                          and stat.st_mtime >= session_started - MADE_WITH_RAY_S)
    if stat.st_uid == os.getuid() and made_by_this_start:
        os.chmod(path, 0o600)
        logger.warning("blitz: made Ray's token file %s mode 600 (Ray wrote it mode %o when "
                       "this cluster started: any local user could read it and run code "
                       "as you on this Ray)", path, stat.st_mode & 0o777)
        return "tightened"
    logger.warning("blitz: %s is readable by other users (mode %o): any of them can run "
                   "code as its owner on this Ray; chmod 600 %s", path,
                   stat.st_mode & 0o777, path)
    return "warned"


def session_started() -> float | None:
    """When the Ray session of this process began (its session directory's change time),
    or None outside a Ray worker or driver."""
    try:
        import ray._private.worker as ray_worker

        node = ray_worker._global_node
        return os.stat(node.get_session_dir_path()).st_ctime if node is not None else None
    except Exception:  # noqa: BLE001 - best effort: no node, an older Ray
        return None


def keep_ray_token_private() -> str:
    """``keep_private`` for Ray's default token file and this session; never raises."""
    try:
        return keep_private(default_token_path(), session_started())
    except OSError as exc:
        logger.warning("blitz: could not check Ray's token file: %s", exc)
        return "unknown"
