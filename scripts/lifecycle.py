"""Start and stop Blitz's Ray and Serve cleanly, HAProxy included (scripts/serve.sh, stop.sh).

    python scripts/lifecycle.py run CONFIG [serve run args...]
        `check`, then, driver-less (the default): scripts/ray_up.py in its own session
        starts Ray's head (no dashboard, log monitor or autoscaler monitor), deploys
        CONFIG and exits; this process adopts Ray's daemons (PR_SET_CHILD_SUBREAPER) and
        waits, importing nothing of Ray. A deploy that fails (ray_up.py's exit status)
        stops everything and is this command's status. On SIGINT/SIGTERM/SIGHUP:
        `shutdown` (drain, then Serve's own shutdown), then SIGTERM/SIGKILL to every
        process of that session in `ray stop`'s order, then `reap`.
        With serve run args, BLITZ_DASHBOARD=1, BLITZ_CONSOLE_LOGS=1 or a cluster to
        join: `serve run CONFIG` in its own session instead (scripts/serve_run.py), as
        before: `drain`, SIGINT (Serve's shutdown), SIGTERM, SIGKILL to its session.
    python scripts/lifecycle.py drain [ADDRESS]
        The first half of a stop, on the Ray cluster at ADDRESS (default `auto`: this
        machine's one Ray, or `ray start`'s; with several and none from `ray start`, it
        refuses): every Blitz ingress replica is told to stop (deployments/draining.py):
        new requests get 503 + Retry-After, which clients and balancers retry, and this
        waits, at most BLITZ_DRAIN_S (60) seconds, until none has a request in flight.
        The applications stay, refusing, until Serve's shutdown (or until the stop
        lapses, BLITZ_DRAIN_S + 120 s later: then they serve again). An application
        whose ingress does not answer (not Blitz's) is deleted instead: each replica
        finishes the requests it holds before it stops. Serve and the proxies stay up.
    python scripts/lifecycle.py shutdown [ADDRESS]
        `drain` (unless BLITZ_DRAIN_S=0), then Serve's own shutdown.
    python scripts/lifecycle.py check CONFIG
        `reap`, then refuse (exit 1) if a port the server needs is held.
    python scripts/lifecycle.py watch PID
        The watchdog a driver-less `run` starts in a session of its own: once lifecycle.py
        PID is gone (killed outright, SIGKILL to it or its process group), `reap` what
        it leaves; nothing when PID stopped cleanly first.
    python scripts/lifecycle.py reap
        Stop the processes of driver-less runs whose lifecycle.py is gone (MARKER in
        their environment), then stale HAProxy processes: those whose config lies in
        Serve's HAProxy directory (<dir>/<node id>/haproxy.cfg, <dir> from
        RAY_SERVE_HAPROXY_CONFIG_FILE_LOC, which scripts/fast-path.env.sh sets) and
        whose Ray node (raylet) is gone or whose parent is pid 1.

Why: Ray starts HAProxy from its HAProxyManager actor; when `serve run` is stopped
without Serve's own shutdown (a signal to one pid, a killed process group) HAProxy can
outlive Ray, holding the ports, and the next start fails ("HAProxy crashed during
startup: ... Address already in use"). Linux only (reads /proc), like Serve's HAProxy.

Why drain first: Ray 2.60's Serve shutdown (`serve shutdown`, `serve.shutdown()`, which
`serve run` calls on SIGINT) stops the HTTP front on its first control-loop tick, at the
same time as it starts stopping the replicas: HAProxyManager.shutdown kills HAProxy with
SIGKILL (haproxy.py HAProxyApi.stop) and, without the fast path, the controller kills
the proxy actor after its shutdown(), which returns at once (proxy_state.py
ActorProxyWrapper.kill). Requests in flight lose their connection although their
replicas drain. So the ingress replicas are told to stop first and the shutdown waits
until they hold nothing: it then finds nothing left to cut. Deleting the applications
instead (what this did before, and still does for an application that is not Blitz's)
also lets each replica finish what it holds, but Serve takes a deleted application's
route away at once: requests arriving during the drain got 404 (Serve's "no route"),
which clients do not retry; now they get 503 with Retry-After.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

GRACE_S = float(os.environ.get("BLITZ_STOP_GRACE_S", "15"))  # Serve's own shutdown
TERM_S = 5.0  # then SIGTERM to `serve run`, then SIGKILL to whatever is left
DRAIN_S = float(os.environ.get("BLITZ_DRAIN_S", "60"))  # delete the apps first; 0: no drain
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# in the environment of every process of a driver-less run: the pid of its lifecycle.py
MARKER = "BLITZ_LIFECYCLE_PID"
WATCH_S = 1.0  # how often the watchdog looks for its lifecycle.py
RESCAN_S = 2.0  # how often a run looks for a new HAProxy while the ones it knows live
# `ray stop`'s order (ray/scripts/scripts.py `stop`): raylet first, GCS last (a GCS
# sent SIGTERM at once with everything else was seen hanging in "Stopping GCS server")
STOP_ORDER = ("raylet", None, "gcs_server")


def log(msg: str) -> None:
    print(f"lifecycle: {msg}", file=sys.stderr, flush=True)


# --- processes --------------------------------------------------------------------------

def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> list[str]:
    return [a.decode(errors="replace") for a in _read(pid, "cmdline").split(b"\0") if a]


def _ppid(pid: int) -> int:
    stat = _read(pid, "stat")
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else 0


def _alive(pid: int) -> bool:
    stat = _read(pid, "stat")
    return bool(stat) and stat[stat.rfind(b")") + 2:][:1] != b"Z"


def _session(sid: int) -> list[int]:
    out = []
    for pid in _pids():
        try:
            if os.getsid(pid) == sid and pid != os.getpid() and _alive(pid):
                out.append(pid)
        except OSError:
            pass
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _wait_gone(pids_fn, deadline: float) -> list[int]:
    left = pids_fn()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = pids_fn()
    return left


# --- HAProxy ----------------------------------------------------------------------------

def haproxy_dir() -> str:
    """Where this user's HAProxy configs lie (scripts/fast-path.env.sh sets it)."""
    from haproxy_loopback import default_dir  # scripts/, this file's folder

    loc = os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC")
    return os.path.realpath(os.path.dirname(loc) if loc else default_dir())


def _haproxy_config(pid: int, root: str) -> str | None:
    """The config under ``root`` that HAProxy ``pid`` runs, if it is one."""
    if b"haproxy" not in _read(pid, "comm") or not _alive(pid):
        return None
    args = _cmdline(pid)
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "-f" and os.path.realpath(value).startswith(root):
            return value
    return None


SERVE_DEFAULT_HAPROXY_DIR = "/tmp/haproxy-serve"
"""Where Serve puts HAProxy's files when nothing names another place: a node started
without scripts/fast-path.env.sh (the README's cluster recipe makes it optional) still
runs serve_config.yaml's HAProxy, with its files there."""


def serve_haproxies() -> list[tuple[int, str]]:
    """(pid, config path) of this user's HAProxy processes with a config in Serve's dir:
    Blitz's private one, or Serve's default (another user's HAProxy is never counted)."""
    roots = {os.path.join(haproxy_dir(), ""),
             os.path.join(os.path.realpath(SERVE_DEFAULT_HAPROXY_DIR), "")}
    found = []
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
        except OSError:
            continue
        config = next((c for root in sorted(roots)
                       if (c := _haproxy_config(pid, root)) is not None), None)
        if config is not None:
            found.append((pid, config))
    return found


def live_nodes() -> set[str]:
    nodes = set()
    for pid in _pids():
        if _read(pid, "comm").strip() == b"raylet":
            nodes |= {a.split("=", 1)[1] for a in _cmdline(pid) if a.startswith("--node_id=")}
    return nodes


def stop_pids(pids: list[int], what: str) -> None:
    _signal(pids, signal.SIGTERM)
    left = _wait_gone(lambda: [p for p in pids if _alive(p)], time.monotonic() + 5)
    if left:
        log(f"{what} {left} ignored SIGTERM; sending SIGKILL")
        _signal(left, signal.SIGKILL)
        _wait_gone(lambda: [p for p in left if _alive(p)], time.monotonic() + 2)


def _marker(pid: int) -> int | None:
    """The lifecycle pid in ``pid``'s environment (MARKER), None without one."""
    for var in _read(pid, "environ").split(b"\0"):
        if var.startswith(MARKER.encode() + b"="):
            value = var.split(b"=", 1)[1]
            return int(value) if value.isdigit() else None
    return None


def _is_lifecycle(pid: int) -> bool:
    return _alive(pid) and any(a.endswith("lifecycle.py") for a in _cmdline(pid)[1:2])


def stale_rays() -> list[int]:
    """Processes of driver-less runs whose lifecycle.py is gone (killed outright: Ray's
    daemons from `ray start` do not share their starter's fate), this user's only."""
    stale = []
    for pid in _pids():
        owner = _marker(pid)
        if owner is None or pid == os.getpid() or not _alive(pid) or _is_lifecycle(owner):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == os.getuid():
                stale.append(pid)
        except OSError:
            pass
    return stale


def stop_ray(pids_fn, hurry: list[bool] | None = None, wait_s: float = 5.0) -> None:
    """SIGTERM the processes ``pids_fn()`` names in `ray stop`'s order (STOP_ORDER), at
    most ``wait_s`` for each step, then SIGKILL what is left."""
    def step(name: str | None) -> list[int]:
        return [p for p in pids_fn() if (_read(p, "comm").strip().decode() == name)
                or (name is None and _read(p, "comm").strip() not in (b"raylet",
                                                                      b"gcs_server"))]
    for name in STOP_ORDER:
        pids = step(name)
        _signal(pids, signal.SIGTERM)
        if not (hurry and hurry[0]):
            _wait_gone(lambda n=name: step(n), time.monotonic() + wait_s)
    left = pids_fn()
    if left:
        log(f"killing {len(left)} Ray process(es) left after SIGTERM: {left}")
        _signal(left, signal.SIGKILL)
        _wait_gone(pids_fn, time.monotonic() + 5)


def reap_rays() -> int:
    stale = stale_rays()
    if stale:
        log(f"stopping {len(stale)} process(es) of Ray started by a scripts/serve.sh "
            f"that is gone (killed outright?): {stale}")
        stop_ray(lambda: [p for p in stale if _alive(p)])
    return len(stale)


def reap() -> int:
    reaped = reap_rays()
    nodes, stale = live_nodes(), []
    for pid, cfg in serve_haproxies():
        node = os.path.basename(os.path.dirname(cfg))
        if node not in nodes or _ppid(pid) == 1:
            why = "its Ray node is gone" if node not in nodes else "its parent is gone"
            log(f"stopping stale HAProxy pid {pid} ({why}; config {cfg})")
            stale.append(pid)
    if stale:
        stop_pids(stale, "stale HAProxy")
    return reaped + len(stale)


# --- ports ------------------------------------------------------------------------------

def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _listener_pids(port: int) -> list[int]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    owners = []
    for pid in _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    owners.append(pid)
                    break
            except OSError:
                pass
    return owners


def will_attach() -> bool:
    """Whether `serve run` will join a running cluster instead of starting Ray."""
    address = os.environ.get("RAY_ADDRESS", "")
    if address:
        return address != "local"
    return os.path.exists(ray_address_file())


def ray_address_file() -> str:
    """Where `ray start` writes its GCS address, which `ray.init()` joins."""
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(tmp, "ray", "ray_current_cluster")


def needed_ports(config: str) -> list[tuple[str, int, str]]:
    import yaml

    with open(config) as f:
        loaded = yaml.safe_load(f) or {}
    http = loaded.get("http_options") or {}
    host = http.get("host") or "127.0.0.1"
    side = "0.0.0.0" if host in ("*", "::") else host
    ports = [(side, int(http.get("port", 8000)), f"HTTP, http_options.port in {config}")]
    grpc = loaded.get("grpc_options") or {}
    if grpc.get("grpc_servicer_functions"):  # gRPC listens where HTTP does (deployments/bind_addresses.py)
        ports.append((side, int(grpc.get("port", 9000)), f"gRPC, grpc_options.port in {config}"))
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        local = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", "").endswith("haproxy-loopback")
        side = "127.0.0.1" if local else "0.0.0.0"
        for var, default, what in (("RAY_SERVE_HAPROXY_STATS_PORT", 8404, "HAProxy stats"),
                                   ("RAY_SERVE_HAPROXY_METRICS_PORT", 9101, "HAProxy metrics")):
            ports.append((side, int(os.environ.get(var, default)), f"{what}, {var}"))
    return ports


def check(config: str) -> bool:
    reap()
    if will_attach():
        log("joining the running Ray cluster (RAY_ADDRESS or `ray start`): its Serve "
            "owns the ports; not checking them")
        return True
    ok, serving = True, dict(serve_haproxies())
    for host, port, what in needed_ports(config):
        try:
            if _port_free(host, port):
                continue
        except OSError as e:
            log(f"cannot check port {port} on {host} ({what}): {e}; going ahead")
            continue
        ok = False
        for pid in _listener_pids(port) or [None]:
            if pid in serving:
                log(f"port {port} ({what}) is held by HAProxy pid {pid} of a running Ray "
                    f"node ({serving[pid]}): another scripts/serve.sh or a `ray start` "
                    "cluster serves there. Stop it (Ctrl-C or SIGTERM to its serve.sh; "
                    "bash scripts/stop.sh for `ray start`) or change the port; not starting.")
            else:
                who = f"pid {pid} ({' '.join(' '.join(_cmdline(pid)).split())[:120]})" if pid else \
                    "a process this user cannot see"
                log(f"port {port} ({what}) is in use by {who}. Stop it or change the "
                    "port; not starting.")
    return ok


# --- drain ------------------------------------------------------------------------------

LOOPBACK = ("127.0.0.1:", "localhost:", "[::1]:")


def local_gcs_addresses() -> set[str]:
    """The GCS addresses of this machine's raylets (their ``--gcs-address``): where
    `ray.init(address="auto")` looks first (services.py `find_gcs_addresses`)."""
    found = set()
    for pid in _pids():
        if _read(pid, "comm").strip() == b"raylet":
            found |= {a.split("=", 1)[1] for a in _cmdline(pid)
                      if a.startswith("--gcs-address=")}
    return found


def _connect(address: str) -> None:
    """`ray.init(address)`, kept on loopback where the Ray it joins is: Ray's driver swaps
    127.0.0.1 (or localhost, ::1) in the address for the machine's routable one, where a
    loopback Ray does not listen, and then waits for ever (ray_up.loopback_driver).
    scripts/ray_up.py's Ray is found at [::ffff:127.0.0.1], which Ray leaves alone; this
    covers a `ray start --head --node-ip-address=127.0.0.1` and an explicit 127.0.0.1.
    With several Ray instances on this machine and none written by `ray start`, `auto`
    would take any of them (services.py `get_ray_address_from_environment`), and drain
    another's applications: this refuses (exit 1), naming them."""
    target = os.environ.get("RAY_ADDRESS") or address
    found = local_gcs_addresses() if target == "auto" else {target}
    if len(found) > 1 and not os.path.exists(ray_address_file()):
        log(f"several Ray instances run on this machine ({', '.join(sorted(found))}); "
            "name one: RAY_ADDRESS=<address> or `lifecycle.py drain <address>`")
        raise SystemExit(1)
    if found and all(a.startswith(LOOPBACK) for a in found):  # ray_up.loopback_driver
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray  # only here: the other commands run without Ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)


def _delete_apps(apps: list[str] | None = None, took_s: float = 0.0) -> int:
    """Delete Serve applications (``apps``, default every one); wait until gone, at most
    DRAIN_S less ``took_s`` already spent."""
    from ray import serve

    start = time.monotonic() - took_s
    apps = list(serve.status().applications) if apps is None else apps
    for app in apps:
        serve.delete(app, _blocking=False)
    left = [app for app in serve.status().applications if app in apps]
    while left and time.monotonic() - start < DRAIN_S:
        time.sleep(0.5)
        left = [app for app in serve.status().applications if app in apps]
    took = time.monotonic() - start
    if left:
        log(f"drain: {left} still there after {DRAIN_S:.0f} s (BLITZ_DRAIN_S); going on")
        return 1
    log(f"drained: {len(apps)} application(s) deleted in {took:.1f} s")
    return 0


# deployments/draining.py's protocol (not imported: this runs without Blitz's packages)
DRAIN_NAMESPACE = "blitz-drain"
INGRESS = "Ingress"  # the ingress deployment's name in every Blitz application
HEARD_S = 5.0  # an ingress that has not answered the stop by then is not listening


def _drain_namespace(app: str) -> str:
    from urllib.parse import quote

    return f"{DRAIN_NAMESPACE}-{quote(app, safe='')}"


def _ingress_replicas(app: str) -> int | None:
    """RUNNING replicas of ``app``'s Blitz ingress; None when it has none (not Blitz)."""
    from ray import serve

    status = serve.status().applications.get(app)
    deployment = status.deployments.get(INGRESS) if status is not None else None
    return None if deployment is None else deployment.replica_states.get("RUNNING", 0)


def _drain_apps() -> int:
    """The drain: each Blitz application's ingress replicas told to stop (new requests get
    503 + Retry-After, those in flight finish; deployments/draining.py), then a wait, at
    most DRAIN_S, until every one reports nothing in flight. The applications stay: Serve's
    shutdown next finds nothing to cut, and no request meets Serve's 404 for a deleted one.
    Applications whose ingress does not answer (not Blitz's, or an older Blitz) are
    deleted instead, as before: each replica finishes what it holds."""
    from ray import serve
    from ray.experimental.internal_kv import (
        _internal_kv_del,
        _internal_kv_get,
        _internal_kv_list,
        _internal_kv_put,
    )

    start = time.monotonic()
    apps = list(serve.status().applications)
    until = f"{time.time() + DRAIN_S + 120:.0f}".encode()  # then the flag lapses by itself
    for app in apps:
        space = _drain_namespace(app)
        for key in _internal_kv_list("", namespace=space):  # an earlier stop's reports
            _internal_kv_del(key, namespace=space)
        _internal_kv_put("stopping", until, overwrite=True, namespace=space)

    def state(app: str) -> str:
        """``idle``, ``busy``, ``unheard`` (no report yet) or ``other`` (no ingress)."""
        wanted = _ingress_replicas(app)
        if wanted is None:
            return "other"
        space = _drain_namespace(app)
        reports = [_internal_kv_get(key, namespace=space)
                   for key in _internal_kv_list("idle:", namespace=space)]
        if not reports:
            return "unheard"
        return "idle" if reports.count(b"1") >= wanted and b"0" not in reports else "busy"

    states = {app: state(app) for app in apps}
    while time.monotonic() - start < DRAIN_S:
        waiting = [app for app, s in states.items() if s == "busy"
                   or (s == "unheard" and time.monotonic() - start < HEARD_S)]
        if not waiting:
            break
        time.sleep(0.25)
        states |= {app: state(app) for app in waiting}
    idle = [app for app, s in states.items() if s == "idle"]
    if idle:
        log(f"drained: {len(idle)} application(s) idle in {time.monotonic() - start:.1f} s "
            "(requests meanwhile got 503 + Retry-After)")
    busy = [app for app, s in states.items() if s == "busy"]
    if busy:
        log(f"drain: {busy} still busy after {DRAIN_S:.0f} s (BLITZ_DRAIN_S); going on")
    others = [app for app, s in states.items() if s in ("unheard", "other")]
    deleted = _delete_apps(others, time.monotonic() - start) if others else 0
    return 1 if busy or deleted else 0


def drain(address: str) -> int:
    """`_drain_apps` at ``address``: at most DRAIN_S."""
    _connect(address)
    return _drain_apps()


def shutdown(address: str) -> int:
    """`drain` (unless BLITZ_DRAIN_S is 0), then Serve's own shutdown (HAProxy included):
    what `serve run` does on SIGINT, for a driver-less run."""
    _connect(address)  # first: it sets what Ray reads at import
    from ray import serve

    status = _drain_apps() if DRAIN_S > 0 else 0
    start = time.monotonic()
    serve.shutdown()
    log(f"Serve shut down in {time.monotonic() - start:.1f} s")
    return status


def gcs_address(sid: int) -> str | None:
    """The GCS address of the Ray node started in session ``sid`` (its raylet's flag)."""
    for pid in _session(sid):
        args = _cmdline(pid)
        if args and os.path.basename(args[0]) == "raylet":
            for arg in args:
                if arg.startswith("--gcs-address="):
                    return arg.split("=", 1)[1]
    return None


def drain_run(sid: int, hurry: list[bool], command: str = "drain") -> None:
    """`drain` (or `shutdown`) the Ray started in session ``sid``, in a child process."""
    if command == "drain" and DRAIN_S <= 0:
        return
    address = gcs_address(sid)
    if address is None:
        log(f"{command}: no Ray node in this run's session (joined a cluster?); skipping it")
        return
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("RAY_AUTH_MODE", "token")  # a new local Ray 2.60 cluster's default
    if DRAIN_S > 0:
        log(f"draining: deleting the applications (at most {DRAIN_S:.0f} s, BLITZ_DRAIN_S)")
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), command, address],
                             env=env, start_new_session=True)
    # connecting to Ray takes a while; Serve's shutdown takes ~10 s
    limit = max(DRAIN_S, 0) + 30 + (GRACE_S if command == "shutdown" else 0)
    deadline = time.monotonic() + limit
    while child.poll() is None and not hurry[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    if child.poll() is None:
        log(f"{command} cut short; stopping now")
        child.kill()
        child.wait()


# --- run --------------------------------------------------------------------------------

def _child_setup() -> None:
    # Background jobs of a non-interactive shell start with SIGINT ignored, and Python
    # then never raises KeyboardInterrupt: give `serve run` its default handlers. If
    # this supervisor is killed outright, `serve run` gets SIGTERM (and Ray with it).
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def stop_run(child: subprocess.Popen, hurry: list[bool]) -> float:
    """Stop `serve run` and everything in its session; seconds taken."""
    start, sid = time.monotonic(), child.pid
    members = lambda: _session(sid)  # noqa: E731
    if child.poll() is None and not hurry[0]:
        drain_run(sid, hurry)
    stopping = time.monotonic()
    if child.poll() is None and not hurry[0]:
        child.send_signal(signal.SIGINT)  # Serve's own shutdown, HAProxy included
        _wait_gone(lambda: [] if hurry[0] else members(), stopping + GRACE_S)
    if child.poll() is None and not hurry[0]:
        log(f"still running after {GRACE_S:.0f} s; sending SIGTERM to serve run")
        child.terminate()
        _wait_gone(lambda: [] if hurry[0] else members(), time.monotonic() + TERM_S)
    left = members()
    if left:
        log(f"killing {len(left)} remaining process(es) of this run: {left}")
        _signal(left, signal.SIGKILL)
        _wait_gone(members, time.monotonic() + 5)
    child.wait()
    reap()
    return time.monotonic() - start


def driverless(extra: list[str]) -> bool:
    """Whether to run driver-less (scripts/ray_up.py) rather than keep `serve run`."""
    if extra:  # `serve run` options: they need `serve run` (scripts/serve_run.py)
        return False
    if os.environ.get("BLITZ_DASHBOARD", "0") == "1":
        return False
    if os.environ.get("BLITZ_CONSOLE_LOGS", "0") == "1":  # the log monitor + a driver
        return False
    return not will_attach()


def _reap_children(tracked: list[subprocess.Popen]) -> None:
    """Collect exited children: as a subreaper this process inherits Ray's daemons when
    `ray start` exits. ``tracked`` ones are left to their Popen, which needs the status."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        for child in tracked:
            if child.pid == info.si_pid:
                child.poll()
                break
        else:
            os.waitpid(info.si_pid, 0)


def _ray_node_up(sid: int) -> bool:
    names = {_read(p, "comm").strip() for p in _session(sid)}
    return b"raylet" in names and b"gcs_server" in names


def _node_watch(sid: int):
    """``_ray_node_up(sid)`` for a loop's every tick: the raylet and GCS found once, then
    each checked alone (its pid, under its name), the machine scanned again only when one
    is gone (a scan reads every process of the machine: five a second cost ~1% of a core)."""
    known: list[tuple[int, bytes]] = []

    def up() -> bool:
        if {n for _, n in known} == {b"raylet", b"gcs_server"} and all(
                _alive(p) and _read(p, "comm").strip() == n for p, n in known):
            return True
        known[:] = [(p, n) for p in _session(sid)
                    if (n := _read(p, "comm").strip()) in (b"raylet", b"gcs_server")]
        return {n for _, n in known} == {b"raylet", b"gcs_server"}

    return up


def _logs_dir(sid: int) -> str:
    for pid in _session(sid):
        for arg in _cmdline(pid):
            if arg.startswith("--log_dir="):
                return arg.split("=", 1)[1]
    return "/tmp/ray/session_latest/logs"


def _start_driverless(config: str) -> subprocess.Popen:
    """scripts/ray_up.py in a session of its own: Ray's daemons inherit that session (and
    MARKER), and this process adopts them when `ray start` exits (a subreaper)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log("prctl(PR_SET_CHILD_SUBREAPER) failed; Ray's daemons will not be our children")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env[MARKER] = str(os.getpid())
    up = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_up.py")
    return subprocess.Popen([sys.executable, up, config], env=env, start_new_session=True,
                            preexec_fn=_child_setup)


def stop_driverless(sid: int, hurry: list[bool], tracked: list[subprocess.Popen]) -> float:
    """Drain and shut Serve down (`lifecycle.py shutdown`), then stop every process of
    session ``sid`` in `ray stop`'s order; seconds taken."""
    start = time.monotonic()
    if not hurry[0] and _ray_node_up(sid):
        drain_run(sid, hurry, "shutdown")
    stop_ray(lambda: _session(sid), hurry)
    for child in tracked:
        child.wait()
    _reap_children([])
    reap()
    return time.monotonic() - start


def _wait(keep_going, tracked: list[subprocess.Popen], requested: list[int],
          standin=None, sid: int = 0) -> None:
    """Until ``keep_going()`` is false or a signal came; with a ``standin``, it looks
    after session ``sid``'s HAProxy on each turn."""
    config, haproxies, scanned = None, [], 0.0
    while keep_going() and not requested:
        _reap_children(tracked + ([standin.proc] if standin and standin.proc else []))
        if standin is not None:
            config = config or _node_config(sid)
            haproxies, scanned = _serving_haproxies(sid, haproxies, scanned)
            standin.tick(haproxies, config)
        time.sleep(0.2)


def _serving_haproxies(sid: int, known: list[tuple[int, str]],
                       scanned: float) -> tuple[list[tuple[int, str]], float]:
    """``_run_haproxies(sid)`` and when it was read: ``known`` again while each of them
    lives and RESCAN_S has not passed since ``scanned`` (a scan reads every process of the
    machine: five a second cost ~1% of a core), read again at once when one is gone."""
    now = time.monotonic()
    if known and now - scanned < RESCAN_S and all(_alive(pid) for pid, _ in known):
        return known, scanned
    return _run_haproxies(sid), now


def _standin():
    """scripts/haproxy_standin.py's supervisor when this run serves through HAProxy."""
    binary = os.environ.get("BLITZ_HAPROXY_REAL")
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1" or not binary:
        return None
    from haproxy_standin import StandIn  # scripts/, this file's folder

    return StandIn(binary, log)


def _node_config(sid: int) -> str | None:
    """Where Serve writes the HAProxy config of the Ray node in session ``sid``
    (<dir>/<node id>/haproxy.cfg, haproxy.py `_per_node`), once its raylet runs."""
    for pid in _session(sid):
        args = _cmdline(pid)
        if args and os.path.basename(args[0]) == "raylet":
            for arg in args:
                if arg.startswith("--node_id="):
                    loc = os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "haproxy.cfg")
                    return os.path.join(haproxy_dir(), arg.split("=", 1)[1],
                                        os.path.basename(loc))
    return None


def _run_haproxies(sid: int) -> list[tuple[int, str]]:
    """(pid, config) of the HAProxy processes Serve started for session ``sid``, sorted
    by pid (the stand-in is not one: it is this process's child, in its session)."""
    root, found = haproxy_dir() + os.sep, []
    for pid in _session(sid):
        config = _haproxy_config(pid, root)
        if config is not None and os.path.basename(config) != "standin.cfg":
            found.append((pid, config))
    return sorted(found)


def watch(pid: int) -> int:
    """Wait until lifecycle.py ``pid`` is gone, then `reap`: a run killed outright leaves
    Ray's daemons running (they do not share a starter's fate), holding the ports, until
    something stops them."""
    while _is_lifecycle(pid):
        time.sleep(WATCH_S)
    reap()
    return 0


def _start_watchdog() -> subprocess.Popen:
    """`watch` this process, from a session of its own (a signal to this process group
    does not reach it); ~9 MiB."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "watch",
                             str(os.getpid())], start_new_session=True,
                            stdin=subprocess.DEVNULL)


def run_driverless(config: str, requested: list[int], hurry: list[bool]) -> int:
    up = _start_driverless(config)
    watchdog = _start_watchdog()
    try:
        return _run_driverless(up, requested, hurry)
    finally:
        watchdog.terminate()  # a clean stop leaves it nothing to do
        watchdog.wait()


def _run_driverless(up: subprocess.Popen, requested: list[int], hurry: list[bool]) -> int:
    sid, tracked = up.pid, [up]
    standin = _standin()  # from the deploy on: HAProxy may die before it is RUNNING
    try:
        _wait(lambda: up.poll() is None, tracked, requested, standin, sid)
        status = 0
        if not requested and up.returncode != 0:
            log(f"the deploy failed (scripts/ray_up.py exited with {up.returncode}); "
                "stopping Ray")
            status = up.returncode or 1
        elif not requested:
            log(f"serving, with no driver: Ray's logs are in {_logs_dir(sid)} (replicas: "
                "serve/); BLITZ_CONSOLE_LOGS=1 prints them here instead (`serve run`)")
            _wait(_node_watch(sid), tracked, requested, standin, sid)
            if not requested:
                log("Ray's raylet or GCS is gone; cleaning up what is left")
                status = 1
    finally:
        if standin is not None:
            standin.stop()
    if requested:
        log(f"{signal.Signals(requested[0]).name}: stopping Ray and every process it "
            "started (a second signal skips the graceful part)")
    log(f"stopped in {stop_driverless(sid, hurry, tracked):.1f} s")
    return status


def console_log_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of `serve run`: with BLITZ_CONSOLE_LOGS=1, the replicas log to
    stderr too (Ray's log monitor forwards it to this console), which the fast path's
    throughput-optimized mode turns off (RAY_SERVE_LOG_TO_STDERR defaults to 0 there)."""
    env = dict(environ)
    if env.get("BLITZ_CONSOLE_LOGS", "0") == "1":
        env.setdefault("RAY_SERVE_LOG_TO_STDERR", "1")
    return env


def run_serve_run(config: str, extra: list[str], requested: list[int],
                  hurry: list[bool]) -> int:
    """`serve run` (scripts/serve_run.py) in its own session, stopped with its session."""
    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_run.py")
    child = subprocess.Popen([sys.executable, driver, "run", config, *extra],
                             env=console_log_env(os.environ), start_new_session=True,
                             preexec_fn=_child_setup)
    while child.poll() is None and not requested:
        time.sleep(0.2)
    if requested:
        log(f"{signal.Signals(requested[0]).name}: stopping serve run and every "
            "process it started (a second signal skips the graceful part)")
    else:
        log(f"serve run exited with {child.returncode}; cleaning up what it left")
    took = stop_run(child, hurry)
    log(f"stopped in {took:.1f} s")
    return 0 if requested else (child.returncode or 0)


FAST_PATH_ENV = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY",
                 "RAY_SERVE_HAPROXY_BINARY_PATH")


def default_proxy_config(config: str, directory: str) -> str:
    """A copy of ``config`` in ``directory`` without the fast path its
    ``controller_options`` turn on (BLITZ_FAST_PATH=0: Serve's default proxy)."""
    import yaml

    with open(config) as f:
        data = yaml.safe_load(f) or {}
    env = (((data.get("controller_options") or {}).get("runtime_env") or {})
           .get("env_vars") or {})
    for name in FAST_PATH_ENV:
        env.pop(name, None)
    path = os.path.join(directory, "serve_config.default-proxy.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path


def run(config: str, extra: list[str]) -> int:
    if os.environ.get("BLITZ_FAST_PATH", "1") == "0":
        import tempfile

        with tempfile.TemporaryDirectory(prefix="blitz-default-proxy-") as directory:
            return _run(default_proxy_config(config, directory), extra)
    return _run(config, extra)


def _run(config: str, extra: list[str]) -> int:
    requested: list[int] = []
    hurry = [False]

    def on_signal(signum, _frame):
        if requested:
            hurry[0] = True
        requested.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if not check(config):
        return 1
    if requested:
        return 0
    if driverless(extra):
        return run_driverless(config, requested, hurry)
    return run_serve_run(config, extra, requested, hurry)


def main(argv: list[str]) -> int:
    if argv[:1] == ["reap"] and len(argv) == 1:
        reap()
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        return 0 if check(argv[1]) else 1
    if argv[:1] == ["drain"] and len(argv) <= 2:
        return drain(argv[1] if len(argv) == 2 else "auto")
    if argv[:1] == ["shutdown"] and len(argv) <= 2:
        return shutdown(argv[1] if len(argv) == 2 else "auto")
    if argv[:1] == ["watch"] and len(argv) == 2 and argv[1].isdigit():
        return watch(int(argv[1]))
    if argv[:1] == ["run"] and len(argv) >= 2:
        return run(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
