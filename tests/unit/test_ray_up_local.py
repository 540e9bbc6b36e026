"""scripts/ray_up.py's single-machine start stays on this machine and this user: Ray's node on 127.0.0.1 unless BLITZ_NODE_IP names another, and Ray's
token file created readable by this user alone (Ray writes it 0644)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ray_up(code: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "BLITZ_"))} | {"HOME": str(home), **env}
    return subprocess.run([sys.executable, "-c", f"import ray_up\n{code}"],
                          cwd=ROOT / "scripts", env=environ, capture_output=True,
                          text=True, timeout=120)


def test_a_missing_token_is_created_mode_600(tmp_path):
    result = ray_up("ray_up.ensure_auth_token()", tmp_path)
    token = tmp_path / ".ray" / "auth_token"
    assert result.returncode == 0, result.stderr
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32
    assert (tmp_path / ".ray").stat().st_mode & 0o077 == 0


def test_a_token_others_can_read_is_left_alone_with_a_warning(tmp_path):
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("x" * 64)
    token.chmod(0o644)
    result = ray_up("ray_up.ensure_auth_token()", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "readable by other users" in result.stderr and "chmod 600" in result.stderr
    assert token.read_text() == "x" * 64 and token.stat().st_mode & 0o777 == 0o644


def test_the_node_and_its_driver_stay_on_loopback(tmp_path):
    code = ("import os\nray_up.loopback_driver(ray_up.NODE_IP)\n"
            "print(ray_up.NODE_IP, os.environ.get('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'))")
    assert ray_up(code, tmp_path).stdout.split() == ["127.0.0.1", "0"]
    named = ray_up(code, tmp_path, BLITZ_NODE_IP="10.1.2.3").stdout.split()
    assert named == ["10.1.2.3", "None"]  # a routable address: Ray's own resolution


def test_the_gcs_is_published_under_a_loopback_name_ray_keeps(tmp_path):
    """A driver's `ray.init(address="auto")` takes the raylet's
    --gcs-address and swaps 127.0.0.1 there for the machine's routable address
    (`canonicalize_bootstrap_address`), where a loopback Ray does not listen: it waited for
    ever. The address ray_up.py hands out is the same socket as [::ffff:127.0.0.1], which
    Ray keeps; where that cannot be reached it stays 127.0.0.1, with a warning."""
    code = (
        "import socket\n"
        "from ray._private.services import canonicalize_bootstrap_address as canon\n"
        "with socket.socket() as s:\n"
        "    s.bind(('127.0.0.1', 0)); s.listen(); port = s.getsockname()[1]\n"
        "    published = ray_up.published_gcs_address('127.0.0.1', port)\n"
        "print(published, canon(published))\n"
        "print(ray_up.published_gcs_address('127.0.0.1', port))\n"  # nothing listens now
        "print(ray_up.published_gcs_address('10.1.2.3', port))\n")
    result = ray_up(code, tmp_path)
    assert result.returncode == 0, result.stderr
    first, closed, routable = result.stdout.splitlines()
    port = routable.rsplit(":", 1)[1]
    assert first.split() == [f"[::ffff:127.0.0.1]:{port}"] * 2
    assert closed == f"127.0.0.1:{port}" and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in result.stderr
    assert routable == f"10.1.2.3:{port}"
