"""Idle CPU by process (loadtest.idle_cpu) on a fake /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadtest.idle_cpu import IdleCpu, format_table, idle_by_name, snapshot

TICK = os.sysconf("SC_CLK_TCK")


def fake_process(proc: Path, pid: int, ppid: int, argv: list[str], ticks: int,
                 comm: str = "python3") -> None:
    d = proc / str(pid)
    d.mkdir()
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    #  utime stime ...": utime and stime are the 12th and 13th fields after the comm
    utime, stime = ticks - ticks // 3, ticks // 3
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 "
                            f"{utime} {stime} 0 0 20 0 1 0\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "comm").write_text(comm + "\n")


def test_snapshot_names_and_times_the_tree_and_every_haproxy(tmp_path: Path):
    fake_process(tmp_path, 1, 0, ["/sbin/init"], 500, comm="init")
    fake_process(tmp_path, 10, 1, ["bash", "scripts/serve.sh"], 2 * TICK, comm="bash")
    fake_process(tmp_path, 11, 10, ["/ray/core/src/ray/gcs/gcs_server", "--x"], TICK,
                 comm="gcs_server")
    fake_process(tmp_path, 12, 11, ["ray::ServeReplica:blitz:Ingress"], 3 * TICK)
    fake_process(tmp_path, 13, 1, ["haproxy", "-f", "cfg"], TICK, comm="haproxy")  # re-parented
    fake_process(tmp_path, 14, 1, ["ray::ServeController"], TICK)  # another tree
    found = snapshot([10], tmp_path)
    assert found == {10: ("bash", 2.0), 11: ("gcs_server", 1.0),
                     12: ("ray::ServeReplica:blitz:Ingress", 3.0), 13: ("haproxy", 1.0)}


def test_idle_by_name_sums_each_name_over_processes_alive_at_both_readings():
    before = {1: ("ray::ServeReplica:blitz:Ingress", 10.0), 2: ("raylet", 5.0),
              3: ("raylet", 1.0), 4: ("gone", 3.0)}
    after = {1: ("ray::ServeReplica:blitz:Ingress", 10.9), 2: ("raylet", 5.3),
             3: ("raylet", 1.3), 5: ("started inside", 9.0)}
    rows = idle_by_name(before, after, 60.0)
    assert [(r.name, r.count) for r in rows] == [
        ("ray::ServeReplica:blitz:Ingress", 1), ("raylet", 2)]
    assert rows[0].cpu_ms == pytest.approx(900) and rows[0].percent == pytest.approx(1.5)
    assert rows[1].cpu_ms == pytest.approx(600) and rows[1].percent == pytest.approx(1.0)


def test_idle_by_name_refuses_an_empty_window():
    with pytest.raises(ValueError):
        idle_by_name({}, {}, 0)


def test_format_table_totals_the_rows():
    table = format_table([IdleCpu("raylet", 2, 600.0, 1.0), IdleCpu("haproxy", 1, 30.0, 0.05)],
                         60)
    assert "| raylet | 2 | 600 | 1.00 |" in table
    assert table.splitlines()[-1] == "| **total** | 3 | 630 | **1.05** |"
