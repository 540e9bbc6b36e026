"""Ray's token file is this user's alone whatever starts Ray (issue 54, a low): the app's
builder makes a token that Ray's own start wrote 0644 (a plain `serve run
serve_config.yaml` on a fresh machine) mode 600, leaves an older one as it is with a
warning, and never deletes or rewrites one; scripts/serve_run.py (serve.sh's `serve run`
path) makes the token mode 600 before Ray starts when it starts one."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from deployments import ray_token
from deployments.ray_token import MADE_WITH_RAY_S, keep_private

ROOT = Path(__file__).resolve().parents[2]


def token(tmp_path: Path, mode: int, age_s: float = 0.0) -> Path:
    path = tmp_path / ".ray" / "auth_token"
    path.parent.mkdir(exist_ok=True)
    path.write_text("x" * 64)
    path.chmod(mode)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_a_token_rays_start_wrote_0644_becomes_600(tmp_path, caplog):
    path = token(tmp_path, 0o644)
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert keep_private(path, session_started=time.time()) == "tightened"
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text() == "x" * 64
    assert "mode 600" in caplog.text


def test_an_older_token_others_can_read_is_left_with_a_warning(tmp_path, caplog):
    path = token(tmp_path, 0o640, age_s=MADE_WITH_RAY_S + 600)
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert keep_private(path, session_started=time.time()) == "warned"
    assert path.stat().st_mode & 0o777 == 0o640 and "chmod 600" in caplog.text
    assert keep_private(path, session_started=None) == "warned"  # no session known


def test_a_private_or_missing_token_is_not_touched(tmp_path):
    path = token(tmp_path, 0o600)
    assert keep_private(path, session_started=time.time()) == "private"
    assert keep_private(tmp_path / "none", session_started=time.time()) == "absent"
    assert not (tmp_path / "none").exists()


def test_the_app_builder_keeps_rays_token_private(tmp_path, monkeypatch):
    """build_app runs it first: in a plain `serve run`, the first Blitz code on the node."""
    from deployments import app

    path = token(tmp_path, 0o644)
    monkeypatch.setattr(ray_token, "default_token_path", lambda: path)
    monkeypatch.setattr(ray_token, "session_started", time.time)
    app.build_app({})
    assert path.stat().st_mode & 0o777 == 0o600


def test_serve_run_py_makes_the_token_600_before_it_starts_ray(tmp_path):
    """scripts/serve_run.py's path (BLITZ_CONSOLE_LOGS=1, BLITZ_DASHBOARD=1, serve run
    options): the token exists, mode 600, before `ray.init()` would write it 0644."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "BLITZ_"))} | {"HOME": str(tmp_path),
                                                          "RAY_TMPDIR": str(tmp_path)}
    code = f"""
import os, serve_run
import ray.serve.scripts as scripts
modes = []  # the token's mode when Ray would start
serve_run.start_ray_without_dashboard = lambda: modes.append(
    oct(os.stat({str(tmp_path / ".ray" / "auth_token")!r}).st_mode & 0o777))
scripts.cli.main = lambda **kw: 0  # `serve run` itself: not run here
serve_run.main(["run", "serve_config.yaml"])
print(modes)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "scripts", env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['0o600']", done.stdout + done.stderr
    assert serve_run_attaching_makes_none(tmp_path, environ)


def serve_run_attaching_makes_none(tmp_path: Path, environ: dict[str, str]) -> bool:
    """With `--address` (a running cluster), no token is made here: that cluster's is used."""
    home = tmp_path / "other-home"
    home.mkdir()
    code = ("import serve_run\n"
            "print(serve_run.starts_local_ray(['serve_config.yaml', '--address', 'x:1']),"
            " serve_run.starts_local_ray(['serve_config.yaml']))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "scripts",
                          env=environ | {"HOME": str(home)}, capture_output=True, text=True,
                          timeout=120)
    return done.stdout.split() == ["False", "True"] and not (home / ".ray").exists()
