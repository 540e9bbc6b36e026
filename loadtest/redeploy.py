"""``python -m loadtest.redeploy``: a redeploy with one model more, under load, on a
cluster the README's recipe starts.

Against a cluster already running ``serve deploy serve_config.yaml`` (for the issue's
recipe: ``ray start --head --num-cpus 2 --num-gpus 1``, see ``loadtest/redeploy.sh``):
``--clients`` clients send 1-text ``/embed`` requests (each with a client timeout well
under Serve's 180 s), ``--after-s`` seconds in, ``serve deploy`` of the same config with
one model more (``--add``, a copy of the first model under a new id) runs, and the
clients go on until the new model has answered for ``--tail-s`` seconds. Reports every
status (503s with and without Retry-After apart), the requests that timed out (hung),
the slowest reply, and when the deploy command returned and the new model first answered.

    python -m loadtest.redeploy [--url URL] [--config serve_config.yaml] [--clients 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import yaml


def with_one_model_more(config: Path, new_id: str) -> Path:
    """A copy of ``config`` whose first app serves a copy of its first model as ``new_id``
    (torch: nothing to build, so the deploy is quick to land)."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    models = data["applications"][0]["args"]["models"]
    models.append({**models[0], "id": new_id, "cpu_backend": "torch"})
    out = Path(tempfile.mkdtemp(prefix="blitz-redeploy-")) / "serve_config.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


def post(url: str, body: dict, timeout_s: float) -> tuple[str, float]:
    """One request's outcome ("200", "503+retry", "503", "timeout", an error's name) and
    how long it took."""
    started = time.monotonic()
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json",
                                              "accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            reply.read()
            outcome = str(reply.status)
    except urllib.error.HTTPError as error:
        retry = "+retry" if error.headers.get("retry-after") else ""
        outcome = f"{error.code}{retry}"
    except TimeoutError:
        outcome = "timeout"
    except OSError as error:
        reason = getattr(error, "reason", None)
        outcome = "timeout" if isinstance(reason, TimeoutError) else type(error).__name__
    return outcome, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--config", type=Path, default=Path("serve_config.yaml"))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=20.0)
    parser.add_argument("--after-s", type=float, default=15.0)
    parser.add_argument("--tail-s", type=float, default=10.0)
    parser.add_argument("--add", default="minilm-added")
    parser.add_argument("--deadline-s", type=float, default=600.0)
    args = parser.parse_args()

    outcomes: list[tuple[str, float, float]] = []  # outcome, seconds, started
    stop = threading.Event()
    begun = time.monotonic()

    def client() -> None:
        while not stop.is_set():
            started = time.monotonic() - begun
            outcome, seconds = post(f"{args.url}/embed", {"texts": ["one text, please"]},
                                    args.timeout_s)
            outcomes.append((outcome, seconds, started))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    time.sleep(args.after_s)
    config = with_one_model_more(args.config, args.add)
    deploy_started = time.monotonic() - begun
    deploy = subprocess.run([str(Path(sys.executable).parent / "serve"), "deploy", str(config)],
                            capture_output=True, text=True,
                            env={**os.environ, "RAY_AUTH_MODE": "token"}, check=False)
    deployed = time.monotonic() - begun
    new_answered = None
    while time.monotonic() - begun < args.deadline_s:
        outcome, _ = post(f"{args.url}/embed", {"texts": ["new model"], "model": args.add},
                          args.timeout_s)
        if outcome == "200":
            new_answered = time.monotonic() - begun
            break
        time.sleep(1)
    time.sleep(args.tail_s)
    stop.set()
    for thread in threads:
        thread.join(args.timeout_s + 5)
    counts = Counter(o for o, _, _ in outcomes)
    during = Counter(o for o, _, started in outcomes if started >= deploy_started)
    print(json.dumps({
        "clients": args.clients, "client_timeout_s": args.timeout_s,
        "deploy_rc": deploy.returncode, "deploy_stderr_tail": deploy.stderr[-300:],
        "deploy_started_s": round(deploy_started, 1), "deploy_returned_s": round(deployed, 1),
        "new_model_answered_s": None if new_answered is None else round(new_answered, 1),
        "outcomes": dict(counts), "outcomes_from_the_deploy_on": dict(during),
        "slowest_s": round(max((s for _, s, _ in outcomes), default=0.0), 2),
    }, indent=1))
    bad = [o for o in counts if o not in ("200", "503+retry")]
    return 1 if bad or new_answered is None or deploy.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
