"""A stand-in HAProxy while Serve replaces one that died (scripts/lifecycle.py runs it).

Serve's HAProxyManager notices its HAProxy is gone only through the controller's proxy
health check (RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S, three failures in a row), then
replaces the whole manager, whose first HAProxy knows no routes yet. Killed outright,
HAProxy cost 30 s of refused connections and some 404s. The HAProxy cannot
be restarted under the manager: Serve checks that the admin socket answers from the pid
it spawned, so a process of ours in its place would fail every later reload.

So the supervisor keeps, beside Serve's HAProxy, a copy of its last config that routes
requests. When no HAProxy of this run is left while Ray is up, it starts the real binary
on that copy at once (``standin.cfg`` next to Serve's config), with the admin socket, the
server-state files and the stats and Prometheus sections taken out: Serve's health check
must keep failing so that Serve replaces its manager, and the stand-in only serves the
application's frontend, with the same backends (the replicas did not move). HAProxy binds
with SO_REUSEPORT, so Serve's new HAProxy shares the port; the stand-in is soft-stopped
(SIGUSR1: it finishes its connections) once a HAProxy of Serve's runs a config with
routes again, or after ``MAX_S`` if that never happens (its routes would go stale).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from haproxy_loopback import ADMIN_MARKERS, _sections, _words  # scripts/, this folder

STANDIN = "standin.cfg"
MAX_S = 120.0
DROPPED_GLOBAL = ("stats socket", "server-state-base", "server-state-file",
                  "load-server-state-from-file")


def routes(text: str) -> bool:
    """Whether a config sends requests to an application (a ``use_backend`` line)."""
    return any(_words(line)[:1] == ["use_backend"] for line in text.splitlines())


def standin_config(text: str) -> str:
    """``text`` without the admin socket, the server-state lines and the sections that
    serve HAProxy's stats page or Prometheus exporter."""
    lines = text.splitlines(keepends=True)
    kept = []
    for _, idx in _sections(lines):
        code = [" ".join(_words(lines[i])) for i in idx]
        if any(marker in c for c in code for marker in ADMIN_MARKERS):
            continue
        kept += [lines[i] for i, c in zip(idx, code, strict=True)
                 if not c.startswith(DROPPED_GLOBAL)]
    return "".join(kept)


class StandIn:
    """Call ``tick(serve_haproxies)`` every few hundred ms with the (pid, config path) of
    the run's live HAProxy processes (the stand-in excluded); ``stop()`` at the end."""

    def __init__(self, binary: str, log: Callable[[str], None]):
        self.binary, self.log = binary, log
        self.snapshot: tuple[str, str] | None = None  # (config path, text with routes)
        self.seen: tuple | None = None  # (config path, mtime, size, inode) last read
        self.routed = False  # whether Serve's config, as last read, has routes
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def tick(self, serving: list[tuple[int, str]], config: str | None) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self.log(f"the stand-in HAProxy exited with {self.proc.returncode}")
            self.proc = None
        if config is not None:
            self._read(config)
        if serving:
            if self.proc is not None and self.routed:
                self.log("Serve's HAProxy is back with its routes; stopping the stand-in")
                self.stop()
        elif self.proc is None and self.snapshot is not None:
            self._start()
        if self.proc is not None and time.monotonic() - self.started > MAX_S:
            self.log(f"Serve's HAProxy is not back after {MAX_S:.0f} s; stopping the "
                     "stand-in (its routes may be stale)")
            self.stop()

    def _read(self, path: str) -> None:
        try:
            st = os.stat(path)
            seen = (path, st.st_mtime_ns, st.st_size, st.st_ino)
            if self.seen == seen:
                return
            with open(path) as f:
                text = f.read()
        except OSError:
            return
        self.seen = seen
        self.routed = routes(text)
        if self.routed:
            self.snapshot = (path, text)

    def _start(self) -> None:
        assert self.snapshot is not None
        path, text = self.snapshot
        directory = os.path.dirname(path)
        config = os.path.join(directory, STANDIN)
        try:
            fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(standin_config(text))
            with open(os.path.join(directory, "standin.log"), "ab") as out:
                self.proc = subprocess.Popen([self.binary, "-db", "-f", config],
                                             stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT)
        except OSError as e:
            self.log(f"HAProxy is gone and the stand-in could not start: {e}")
            self.snapshot = None  # once: the supervisor does not retry in a loop
            return
        self.started = time.monotonic()
        self.log(f"Serve's HAProxy is gone; a stand-in (pid {self.proc.pid}) serves its "
                 f"last routes until Serve replaces it ({config})")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGUSR1)  # soft stop: finish the connections it holds
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
