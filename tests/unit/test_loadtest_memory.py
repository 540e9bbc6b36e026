"""PSS of a process tree (loadtest.memory) on a fake /proc."""

from __future__ import annotations

from pathlib import Path

from loadtest.memory import by_name, format_table, process_name, tree_memory

ROLLUP = """55d0c0a00000-7ffd5e5f1000 ---p 00000000 00:00 0                          [rollup]
Rss:              {rss} kB
Pss:              {pss} kB
Pss_Anon:         1 kB
"""


def fake_process(proc: Path, pid: int, ppid: int, argv: list[str], pss: int | None) -> None:
    d = proc / str(pid)
    d.mkdir()
    comm = argv[0][:15] if argv else "x"
    (d / "stat").write_text(f"{pid} ({comm} (odd) name) S {ppid} {pid} {pid} 0 -1\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    if pss is not None:
        (d / "smaps_rollup").write_text(ROLLUP.format(rss=2 * pss, pss=pss))


def test_tree_sums_pss_of_root_and_descendants_only(tmp_path: Path):
    py = "/venv/bin/python"
    fake_process(tmp_path, 1, 0, ["/sbin/init"], 5000)
    fake_process(tmp_path, 10, 1, ["bash", "scripts/serve.sh"], 2048)
    fake_process(tmp_path, 11, 10, [py, "scripts/serve_run.py", "run", "c.yaml"], 102400)
    fake_process(tmp_path, 12, 11, ["/ray/core/src/ray/raylet/raylet", "--x"], 30720)
    fake_process(tmp_path, 13, 12, ["ray::ServeReplica:blitz:CPUPool"], 716800)
    fake_process(tmp_path, 14, 12, ["ray::ServeReplica:blitz:Ingress.handle_request"], 92160)
    fake_process(tmp_path, 15, 12, ["ray::ServeReplica:blitz:Ingress"], 92160)
    fake_process(tmp_path, 16, 11, [py, "-u", "/ray/_private/log_monitor.py", "--a"], 46080)
    fake_process(tmp_path, 17, 11, [py, "/ray/dashboard/dashboard.py", "--host=x"], 75776)
    fake_process(tmp_path, 18, 13, ["haproxy", "-f", "cfg"], 10240)
    fake_process(tmp_path, 19, 11, ["gone"], None)  # exited between the listing and the read
    fake_process(tmp_path, 20, 1, ["ray::ServeController"], 99999)  # another tree
    (tmp_path / "self").mkdir()  # not a pid

    found = tree_memory([10], tmp_path)

    assert [p.pid for p in found] == [13, 11, 14, 15, 17, 16, 12, 18, 10]
    assert sum(p.pss_kib for p in found) == 2048 + 102400 + 30720 + 716800 + 2 * 92160 \
        + 46080 + 75776 + 10240
    names = {name: (count, kib) for name, count, kib in by_name(found)}
    assert names["ray::ServeReplica:blitz:Ingress"] == (2, 184320)
    assert names["serve run"] == (1, 102400)
    assert names["log monitor"] == (1, 46080)
    assert names["dashboard head"] == (1, 75776)
    assert set(names) >= {"raylet", "haproxy", "bash", "ray::ServeReplica:blitz:CPUPool"}
    table = format_table(found)
    assert table.splitlines()[2] == "| ray::ServeReplica:blitz:CPUPool | 1 | 700 |"
    assert table.splitlines()[-1] == "| **total** | 9 | **1141** |"


def test_no_live_root_is_an_empty_tree(tmp_path: Path):
    fake_process(tmp_path, 1, 0, ["/sbin/init"], 5000)
    assert tree_memory([99], tmp_path) == []


def test_process_names():
    py = "/v/bin/python3.11"
    assert process_name([]) == "?"
    assert process_name(["ray-dashboard-NodeHead-0 (/v/bin/python -B -c ...)"]) \
        == "ray-dashboard-NodeHead-0"
    assert process_name([py, "/v/bin/serve", "run", "serve_config.yaml"]) == "serve run"
    assert process_name([py, "-B", "-c", "from multiprocessing.forkserver import main"]) \
        == "dashboard module forkserver"
    assert process_name([py, "-u", "/r/autoscaler/_private/monitor.py"]) == "autoscaler monitor"
    assert process_name([py, "-c", "print(1)"]) == "python -c"
    assert process_name(["/r/core/src/ray/gcs/gcs_server", "--log_dir=x"]) == "gcs_server"


def test_haproxy_outside_the_tree_joins_it_when_asked(tmp_path: Path):
    from loadtest.memory import roots

    fake_process(tmp_path, 1, 0, ["/sbin/init"], 5000)
    fake_process(tmp_path, 10, 1, ["bash", "scripts/serve.sh"], 2048)
    fake_process(tmp_path, 30, 1, ["haproxy", "-f", "cfg"], 10240)  # re-parented to init
    (tmp_path / "30" / "comm").write_text("haproxy\n")
    (tmp_path / "10" / "comm").write_text("bash\n")
    assert [p.pid for p in tree_memory(roots([10], False, tmp_path), tmp_path)] == [10]
    both = tree_memory(roots([10], True, tmp_path), tmp_path)
    assert sorted(p.pid for p in both) == [10, 30]
