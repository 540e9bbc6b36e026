"""Start a local Ray head without a long-lived driver and deploy CONFIG on it; then exit.

    python scripts/ray_up.py CONFIG

scripts/lifecycle.py runs this (docs/fast-path.md, "Start and stop", "What
scripts/serve.sh leaves out") in a session of its own and waits for it:

1. Start Ray's head node as `ray.init()` does for a new local cluster (worker.py `init`:
   a ray._private.node.Node), on 127.0.0.1 (BLITZ_NODE_IP names another address): GCS,
   raylet, workers, the agents and the metrics export then listen on loopback only
   (deployments/bind_addresses.py does it for the replicas' gRPC servers). The GCS address the
   raylet, agents and workers are given is [::ffff:127.0.0.1]:PORT, the same loopback
   socket under a name Ray's drivers do not swap for the machine's routable address, so
   that `ray.init(address="auto")` on this machine (the README's Ray handle example,
   `lifecycle.py drain`) joins this Ray with nothing set (`published_gcs_address`).
   Three more differences. The log monitor and the
   autoscaler monitor stay off (RayParams include_log_monitor, no_monitor, read by
   `Node.start_ray_processes` / `Node.start_head_processes`; `ray.init()` never sets
   them): with no driver the log monitor has no one to forward logs to, and one node
   has nothing to autoscale (Serve scales replicas from its controller). No reaper and
   no PR_SET_PDEATHSIG (spawn_reaper=False): the processes outlive this one. Not
   `ray start`: it also starts a Ray Client server whenever grpc is installed (~50 MiB;
   `--ray-client-server-port` refuses 0, parameter.py `_check_usage`), takes port 6379
   unless told otherwise, and writes /tmp/ray/ray_current_cluster, where every later
   `ray.init()` of this user would find this Ray and join it.
2. Connect, and run `serve run --non-blocking CONFIG` (Serve's own click command, in
   process): the same config handling as `serve run`, without staying. A config's apps
   are built by Serve's controller, so nothing of them lives in this process.
3. Write Prometheus's file-discovery list /tmp/ray/prom_metrics_service_discovery.json
   once, with Ray's own PrometheusServiceDiscoveryWriter (the dashboard's Report module
   rewrites it every 5 s; with one node its content never changes).
4. Wait until every application of CONFIG is RUNNING (exit 0) or one is DEPLOY_FAILED
   (print Serve's message, which holds the error, and exit 1), with deadlines: a replica
   that Ray has not placed for ``ingress.unplaced_after_s`` (30 s) while its claim does
   not fit what is free (one node: nothing else will free it) ends the wait naming both;
   any application not RUNNING after BLITZ_DEPLOY_TIMEOUT_S (900 s) ends it with each
   deployment's state (exit 4 for both).

Exit codes: 0 deployed, 1 the deploy failed, 3 Ray did not start, 4 not running in time.
Token authentication is on unless RAY_AUTH_MODE says otherwise, with a token generated
when there is none, as `ray.init()` does for a new local cluster in Ray 2.60.
"""

from __future__ import annotations

import os
import sys
import time

import yaml

POLL_S = 1.0
DEPLOY_TIMEOUT_S = float(os.environ.get("BLITZ_DEPLOY_TIMEOUT_S", "900"))
NODE_IP = os.environ.get("BLITZ_NODE_IP", "127.0.0.1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg: str) -> None:
    print(f"ray_up: {msg}", file=sys.stderr, flush=True)


def loopback_driver(node_ip: str) -> None:
    """Keep this process's Ray driver on loopback when the node is: `ray.init(address=
    "127.0.0.1:…")` otherwise swaps loopback for the machine's routable address
    (services.py `resolve_ip_for_localhost`), where nothing listens. Before Ray is imported:
    ray_constants reads it at import. Children inherit it; a worker takes its address
    from its raylet, so it changes nothing there."""
    if node_ip in ("127.0.0.1", "localhost", "::1"):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def ensure_auth_token() -> None:
    """Token auth on by default, a token generated if missing: what ray.init() does, but
    the token file created readable by this user alone (Ray writes it 0644: any local
    user could read it and run code as this one). A token file that exists is left as it
    is, with a warning when others may read it."""
    from ray._private.authentication.authentication_token_setup import (
        _get_default_token_path,
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
        generate_new_authentication_token,
    )

    enable_token_auth_by_default()  # sets RAY_AUTH_MODE=token unless it is set
    path = _get_default_token_path()
    if (os.environ.get("RAY_AUTH_MODE") == "token" and not os.environ.get("RAY_AUTH_TOKEN")
            and not os.environ.get("RAY_AUTH_TOKEN_PATH")):
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another start made it meanwhile: theirs
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(generate_new_authentication_token())
                log(f"generated Ray's token in {path} (mode 600)")
        elif path.stat().st_mode & 0o077:
            log(f"WARNING: {path} is readable by other users (mode "
                f"{path.stat().st_mode & 0o777:o}): any of them can run code as you on "
                f"this Ray; chmod 600 {path}")
    ensure_token_if_auth_enabled(None, create_token_if_missing=True)


MAPPED_LOOPBACK = "::ffff:127.0.0.1"
"""127.0.0.1 written as an IPv4-mapped IPv6 address: the same socket (Ray's gRPC servers
on a 127.0.0.1 node listen on [::ffff:127.0.0.1]), but not one of the names Ray swaps
for the machine's routable address (`is_localhost`: 127.0.0.1, ::1, localhost)."""
LOOPBACK_DRIVER_HINT = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment of a "
                        "driver that joins it (`ray.init(address=\"auto\")`, the README's "
                        "Ray handle example)")


def reachable(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``host``:``port`` opens (IPv6 sockets may be off)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect((host, port))
    except OSError:
        return False
    return True


def published_gcs_address(node_ip: str, port: int) -> str:
    """The GCS address the node's raylet, workers and agents are given, and so the one a
    driver's `ray.init(address="auto")` finds (services.py `find_gcs_addresses` reads the
    raylet's ``--gcs-address``). Ray's driver replaces 127.0.0.1 there with the machine's
    routable address (`canonicalize_bootstrap_address` -> `resolve_ip_for_localhost`),
    where nothing listens: that `ray.init` waits for ever. [::ffff:127.0.0.1] is the same
    loopback socket under a name Ray keeps, so every driver of this machine joins as it
    is, with nothing set. Where IPv6 sockets are off it stays 127.0.0.1 (with a warning:
    drivers then need LOOPBACK_DRIVER_HINT)."""
    from ray._common.network_utils import build_address

    if node_ip == "127.0.0.1":
        if reachable(MAPPED_LOOPBACK, port):
            return build_address(MAPPED_LOOPBACK, port)
        log(f"WARNING: cannot reach the GCS at [{MAPPED_LOOPBACK}]:{port} (IPv6 sockets "
            f"off?); publishing 127.0.0.1:{port}: drivers need {LOOPBACK_DRIVER_HINT}")
    return build_address(node_ip, port)


def start_head() -> str:
    """Start Ray's head node processes as `ray.init()` does for a new local cluster
    (worker.py `init`), but with the dashboard, the log monitor, the autoscaler monitor
    off, and with no fate sharing (no reaper, no PR_SET_PDEATHSIG): they outlive this
    process; and with the GCS address every other process is given written so that
    `ray.init(address="auto")` elsewhere on this machine joins this loopback node
    (`published_gcs_address`). Returns the GCS address."""
    from ray._common.usage import usage_lib
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    class LoopbackNode(Node):
        def start_gcs_server(self):
            super().start_gcs_server()  # sets _gcs_address: node IP, the GCS's port
            # before anything is given it: the raylet, the agents, the workers
            self._gcs_address = published_gcs_address(self._node_ip_address,
                                                       self._ray_params.gcs_server_port)

    usage_lib.set_usage_stats_enabled_via_env_var(False)  # as ray.init() does
    params = RayParams(include_dashboard=False, include_log_monitor=False, no_monitor=True,
                       node_ip_address=NODE_IP)
    node = LoopbackNode(params, head=True, shutdown_at_exit=False, spawn_reaper=False,
                        ray_init_cluster=True)
    return node.address


def write_discovery_file(gcs_address: str) -> str:
    import ray
    from ray._private.metrics_agent import PrometheusServiceDiscoveryWriter

    node = ray._private.worker.global_worker.node
    writer = PrometheusServiceDiscoveryWriter(gcs_address, node.get_temp_dir_path(),
                                              node.get_session_dir_path())
    writer.write()  # into the session dir, linked from the temp dir (/tmp/ray/...)
    return os.path.join(node.get_temp_dir_path(),
                        ray._private.ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE)


def deploy(config: str, gcs_address: str) -> bool:
    """`serve run --non-blocking CONFIG` against ``gcs_address``; whether it submitted."""
    from ray.serve.scripts import cli

    try:
        cli.main(args=["run", "--non-blocking", "--address", gcs_address, config],
                 prog_name="serve", standalone_mode=False)
    except SystemExit:  # `serve run` reports an error, shuts Serve down and exits
        return False
    return True


def failure_report(name: str, app) -> str:
    lines = [f"application {name!r} is {app.status.value}: {app.message}"]
    for dep_name, dep in app.deployments.items():
        if dep.message:
            lines.append(f"  deployment {dep_name!r} {dep.status.value}: {dep.message}")
    return "\n".join(lines)


def _on_path() -> None:
    """blitz/ and deployments/ importable from this checkout (once)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def unplaced(names: list[str], since: dict[tuple[str, str], float], now: float,
             after_s: float) -> str | None:
    """Why a replica of ``names`` cannot start: Ray has left it unplaced for ``after_s``
    and its claim does not fit what is free; ``since`` keeps when each began to wait."""
    _on_path()
    from blitz.ingress.placement import SECTIONS, short_of, unplaced_message
    from deployments.placement import free_resources, pending_replicas

    pending = {key: claim for key, claim in pending_replicas().items() if key[0] in names}
    for key in list(since):
        if key not in pending:
            del since[key]
    for (app, deployment), claim in pending.items():
        waited = now - since.setdefault((app, deployment), now)
        free = free_resources()
        if waited >= after_s and short_of(claim, free):  # on one node, nothing frees it
            section = SECTIONS.get(deployment, deployment)
            return f"application {app!r}: " + unplaced_message(
                section, deployment, claim, free, waited)
    return None


def wait_running(names: list[str], after_s: float,
                 timeout_s: float = DEPLOY_TIMEOUT_S) -> int:
    """Until every app in ``names`` is RUNNING (0), one is DEPLOY_FAILED (1), a replica
    cannot be placed or the deadline passes (4)."""
    from ray import serve

    seen: dict[str, str] = {}
    waiting: dict[tuple[str, str], float] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        apps = serve.status().applications
        for name in names:
            app = apps.get(name)
            status = app.status.value if app else "NOT_STARTED"
            if seen.get(name) != status:
                seen[name] = status
                log(f"application {name!r}: {status}")
            if status == "DEPLOY_FAILED":
                log(failure_report(name, app))
                return 1
        if all(s == "RUNNING" for s in seen.values()):
            return 0
        now = time.monotonic()
        reason = unplaced(names, waiting, now, after_s)
        if reason is None and now >= deadline:
            reason = f"not running after {timeout_s:.0f} s (BLITZ_DEPLOY_TIMEOUT_S):\n" + "\n".join(
                failure_report(name, apps[name]) for name in names
                if name in apps and seen[name] != "RUNNING")
        if reason is not None:
            log(f"the deploy cannot finish: {reason}")
            return 4
        time.sleep(POLL_S)


def read_apps(config: str) -> list[dict]:
    with open(config) as f:
        return (yaml.safe_load(f) or {}).get("applications") or []


def unplaced_after_s(apps: list[dict]) -> float:
    """The longest ``ingress.unplaced_after_s`` of the apps (the setting's default where
    an app names none)."""
    _on_path()
    from blitz.settings.config import IngressSettings

    default = IngressSettings.model_fields["unplaced_after_s"].default
    return max((float(((app.get("args") or {}).get("ingress") or {}).get(
        "unplaced_after_s", default)) for app in apps), default=default)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    config = argv[0]
    loopback_driver(NODE_IP)
    ensure_auth_token()
    try:
        gcs_address = start_head()
    except Exception as exc:  # noqa: BLE001 - any failure to start: report, exit 3
        log(f"starting Ray failed: {exc!r}")
        return 3
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    ray.init(address=gcs_address, namespace=SERVE_NAMESPACE, log_to_driver=False,
             logging_level="WARNING")
    log(f"Ray started at {gcs_address}; metrics discovery list "
        f"{write_discovery_file(gcs_address)}")
    if gcs_address.startswith(("127.0.0.1:", "localhost:", "[::1]:")):
        log(f"a driver that joins this Ray needs {LOOPBACK_DRIVER_HINT}")
    else:
        log('ray.init(address="auto") on this machine joins it (the README\'s Ray handle '
            f'example), as does RAY_ADDRESS={gcs_address} with RAY_AUTH_MODE=token')
    if not deploy(config, gcs_address):
        return 1
    apps = read_apps(config)
    return wait_running([app.get("name", "default") for app in apps], unplaced_after_s(apps))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
