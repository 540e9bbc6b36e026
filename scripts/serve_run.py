"""`serve run` on a local Ray started without the dashboard (scripts/lifecycle.py runs it).

    python scripts/serve_run.py run CONFIG [serve run args...]

is `serve run CONFIG ...`, except that when it starts Ray itself it starts it with
`include_dashboard=False` (docs/benchmarks-history.md, "Idle memory"): no
dashboard UI and
no dashboard head modules (nine processes, ~190 MiB PSS at idle), and a dashboard head
that loads only its usage-stats module. `serve run` calls `ray.init()` only when Ray is
not initialized yet, and has no option for the dashboard, so this initializes it first,
with the arguments `serve run` would have used (its namespace, no runtime_env).

What stays: the metrics export (Ray's metrics agent runs in the dashboard *agent*, which
the raylet starts either way) and the Prometheus file-discovery list
/tmp/ray/prom_metrics_service_discovery.json, which the dashboard's ReportHead writes and
which this driver writes instead with Ray's own writer. What goes: the `serve status`,
`serve deploy`, `serve config` and `serve shutdown` commands against this Ray (they call
the dashboard's REST API; `serve.status()` and the rest of the Python API talk to the
GCS and still work), `ray job`, `ray logs`, `ray list` (the state API) and the UI.

BLITZ_DASHBOARD=1 keeps the dashboard (plain `serve run`), and so does joining a running
cluster (RAY_ADDRESS, `ray start`: its own settings apply) or passing `serve run` an
address or a runtime environment, which this does not forward to `ray.init`.

Either way, when a local Ray is to start, Ray's token file is made first, mode 600
(scripts/ray_up.py `ensure_auth_token`): left to `ray.init()`, it would be 0644.
"""

from __future__ import annotations

import os
import sys

from lifecycle import log, will_attach
from ray_up import ensure_auth_token

# `serve run` options this driver would have to pass to ray.init; with any of them given,
# `serve run` starts Ray itself (dashboard included)
RAY_INIT_OPTIONS = ("--address", "-a", "--runtime-env", "--runtime-env-json",
                    "--working-dir")


def without_dashboard(args: list[str]) -> bool:
    """Whether to start the local Ray here, without the dashboard."""
    if os.environ.get("BLITZ_DASHBOARD", "0") == "1" or will_attach():
        return False
    return not any(a == opt or a.startswith(opt + "=") for a in args for opt in RAY_INIT_OPTIONS)


def starts_local_ray(args: list[str]) -> bool:
    """Whether `serve run` with ``args`` starts a Ray of its own on this machine."""
    if will_attach():
        return False
    return not any(a == opt or a.startswith(opt + "=") for a in args
                   for opt in ("--address", "-a"))


def start_ray_without_dashboard() -> None:
    import ray
    from ray._private.metrics_agent import PrometheusServiceDiscoveryWriter
    from ray.serve._private.constants import SERVE_NAMESPACE

    ray.init(namespace=SERVE_NAMESPACE, include_dashboard=False)
    node = ray._private.worker.global_worker.node
    writer = PrometheusServiceDiscoveryWriter(node.gcs_address,
                                              node.get_temp_dir_path(),
                                              node.get_session_dir_path())
    writer.daemon = True  # rewritten every 5 s, as the dashboard does, until exit
    writer.start()


def main(argv: list[str]) -> int:
    if argv[:1] != ["run"] or len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if starts_local_ray(argv[1:]):  # its token made here, mode 600
        ensure_auth_token()
    if without_dashboard(argv[1:]):
        start_ray_without_dashboard()
    else:
        log("starting `serve run` with Ray's dashboard (BLITZ_DASHBOARD=1, a running "
            "cluster, or a serve run option for ray.init)")
    from ray.serve.scripts import cli

    return cli.main(args=argv, prog_name="serve", standalone_mode=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
