"""Fault: what `bash scripts/serve.sh` exposes (loopback only) and how it survives its
HAProxy dying, on a real run with its own Ray (RAY_ADDRESS=local) and ports.

- Every socket that any process of the run listens on (serve.sh's descendants, Ray's
  session, HAProxy) is bound to loopback: Ray's node on 127.0.0.1 (scripts/ray_up.py),
  each replica's inter-deployment gRPC server on its node's address
  (deployments/bind_addresses.py), the metrics export where Ray puts it for a loopback node.
- Ray's token file and HAProxy's directory are this user's alone.
- HAProxy killed outright (SIGKILL) while a client sends requests: a stand-in serves
  the last routes while no HAProxy of Serve's runs (scripts/haproxy_standin.py), no
  reply is a 404, every error reply is a 503 with Retry-After, Serve's replacement comes
  back with its routes and the stand-in goes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.faults.test_lifecycle import (
    HAPROXY_DIR,
    Run,
    cmdline,
    comm,
    descendants,
    pids,
    run_env,
    session,
)
from tests.ports import stable_port
from tests.waiting import wait_until


def app(args: dict) -> None:
    args["models"] = [{"id": "free", "source": "fake:8"}]
    args["default_model"] = "free"
    args["cpu_pool"]["preload"] = ["free"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("supervision")
    taken: set[int] = set()
    ports = {name: stable_port(taken) for name in ("http", "stats", "metrics")}
    served = Run("supervision", run_env(directory, ports, app), ports["http"], directory)
    try:
        served.wait_ready()
        yield served
    finally:
        served.kill()


def _address(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw)) + f":{int(port, 16)}"
    words = [raw[i:i + 4][::-1].hex() for i in range(0, 16, 4)]
    text = "".join(words)
    groups = [text[i:i + 4] for i in range(0, 32, 4)]
    return f"[{ipaddress.IPv6Address(':'.join(groups)).compressed}]:{int(port, 16)}"


def listening() -> dict[str, str]:
    """socket inode -> local address, for every TCP socket in LISTEN state."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":
                found[cols[9]] = _address(cols[1])
    return found


def sockets_of(pid: int, inodes: dict[str, str]) -> list[str]:
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            out.append(inodes[target[8:-1]])
    return out


def run_processes(run: Run) -> list[int]:
    haproxies = [p for p in pids() if "haproxy" in comm(p)
                 and any(a.startswith(str(HAPROXY_DIR) + os.sep) for a in cmdline(p))]
    return sorted(set(descendants(run.proc.pid) + session(run.sid) + haproxies))


def on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]"))
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def test_every_listening_socket_is_on_loopback(run):
    inodes = listening()
    seen = {pid: sockets_of(pid, inodes) for pid in run_processes(run)}
    bound = {f"{comm(pid)} (pid {pid})": addrs for pid, addrs in seen.items() if addrs}
    # the run's own: HTTP, Ray's GCS, a replica's gRPC server
    assert any(a.endswith(f":{run.port}") for addrs in bound.values() for a in addrs)
    assert any("gcs_server" in who for who in bound)
    assert any("ServeRepli" in who for who in bound)
    exposed = {who: [a for a in addrs if not on_loopback(a)]
               for who, addrs in bound.items()}
    assert not {who: a for who, a in exposed.items() if a}, bound


def test_haproxy_files_are_in_a_private_directory(run):
    config = next(a for p in serve_haproxies(run) for a in cmdline(p) if a.endswith(".cfg"))
    assert config.startswith(str(HAPROXY_DIR) + os.sep)
    mode = HAPROXY_DIR.stat()
    assert mode.st_uid == os.getuid() and stat.S_IMODE(mode.st_mode) == 0o700


def serve_haproxies(run: Run) -> list[int]:
    mine = set(session(run.sid))
    return [p for p in mine if "haproxy" in comm(p)
            and not any(a.endswith("standin.cfg") for a in cmdline(p))]


def standins() -> list[int]:
    return [p for p in pids() if "haproxy" in comm(p)
            and any(a.endswith("standin.cfg") for a in cmdline(p))]


def test_a_killed_haproxy_is_stood_in_for_and_replaced(run):
    # (status, retry-after, whether no HAProxy of Serve's ran before or after it)
    replies: list[tuple[int | str, str | None, bool]] = []
    stop = threading.Event()
    body = json.dumps({"texts": ["an ordinary request"]}).encode()

    def client() -> None:
        while not stop.is_set():
            down = not serve_haproxies(run)
            request = urllib.request.Request(f"http://127.0.0.1:{run.port}/embed", data=body,
                                             headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as reply:
                    reply.read()
                    replies.append((reply.status, None, down and not serve_haproxies(run)))
            except urllib.error.HTTPError as error:
                replies.append((error.code, error.headers.get("retry-after"), False))
            except OSError as error:
                replies.append((type(error).__name__, None, False))
            time.sleep(0.05)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        wait_until(lambda: len(replies) >= 5, "the client to get going", 30)
        killed = serve_haproxies(run)
        assert killed
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: standins(), "the stand-in HAProxy", 10, interval_s=0.1)
        wait_until(lambda: not standins() and serve_haproxies(run),
                   "Serve's HAProxy back and the stand-in gone", 90, interval_s=0.5)
        # Serve's new HAProxy may still answer a fast 503 + Retry-After while its
        # routes land; the client must then get five 200s in a row
        wait_until(lambda: [s for s, _, _ in replies[-5:]] == [200] * 5,
                   "five 200s in a row after the replacement", 30)
    finally:
        stop.set()
        thread.join(30)
    statuses = [s for s, _, _ in replies]
    assert 404 not in statuses
    assert all(retry for s, retry, _ in replies if s == 503)
    assert not [s for s in statuses if isinstance(s, int) and s not in (200, 503)]
    # answered while no HAProxy of Serve's ran: the stand-in's doing
    assert any(s == 200 and down for s, _, down in replies)
    refused = [s for s in statuses if not isinstance(s, int)]
    assert len(refused) <= len(statuses) // 10, statuses
    assert "a stand-in" in run.tail() and "back with its routes" in run.tail()
