"""Child processes of a model load (blitz.runtime.child_process): killed with their process group
past their deadline, and killed when their parent dies; the ONNX build and the auto
backend's measurement both start theirs this way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from blitz.errors import ModelLoadFailed
from blitz.loading import child_work as load_children
from blitz.loading.load import load_encoder
from blitz.runtime import child_process
from blitz.runtime.child_process import ChildTimedOut, run_child
from blitz.settings.registry import ModelSpec
from tests.waiting import wait_until

WAIT_S = 10.0  # bound on every wait; a healthy run needs a small part of it

# writes its pid, starts a grandchild that writes its own, then sleeps
_SPAWNER = """
import subprocess, sys, time
out = sys.argv[1]
subprocess.Popen([sys.executable, "-c",
                  f"import os, time; open({out!r} + '.grandchild', 'w').write(str(os.getpid())); time.sleep(60)"])
open(out + ".child", "w").write(str(__import__("os").getpid()))
time.sleep(60)
"""

# a replica stand-in: starts a child through run_child and waits for it
_PARENT = """
import sys
from blitz.runtime.child_process import run_child
run_child([sys.executable, "-c", sys.argv[1], sys.argv[2]], timeout_s=60)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _read_pid(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text(), f"{path.name} to start",
                          WAIT_S, interval_s=0.02))


def _until_gone(pid: int) -> None:
    wait_until(lambda: not _alive(pid), f"process {pid} to end", WAIT_S, interval_s=0.02)


def test_a_child_past_its_timeout_is_killed_with_its_process_group(tmp_path):
    out = tmp_path / "pids"
    started = time.monotonic()
    with pytest.raises(ChildTimedOut, match="did not finish within 1 s"):
        run_child([sys.executable, "-c", _SPAWNER, str(out)], timeout_s=1)
    assert time.monotonic() - started < 5
    for name in ("child", "grandchild"):
        _until_gone(_read_pid(out.with_suffix(f".{name}")))


def test_a_child_dies_with_its_parent(tmp_path):
    out = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _SPAWNER, str(out)],
                              cwd=Path(__file__).parents[2])
    try:
        child = _read_pid(out.with_suffix(".child"))
        _read_pid(out.with_suffix(".grandchild"))
        parent.send_signal(signal.SIGKILL)  # a replica killed: no cleanup code runs
        parent.wait(WAIT_S)
        _until_gone(child)
    finally:
        parent.kill()
        parent.wait(WAIT_S)
        for name in ("child", "grandchild"):  # the grandchild is the child's business
            path = out.with_suffix(f".{name}")
            if path.exists() and _alive(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


def test_a_child_that_ends_in_time_gives_its_output():
    done = run_child([sys.executable, "-c", "print('hi')"], child_process.DEFAULT_TIMEOUT_S)
    assert (done.returncode, done.stdout) == (0, "hi\n")


@pytest.fixture
def hanging_python(tmp_path) -> types.SimpleNamespace:
    """A ``sys`` whose ``executable`` hangs: a child started from it never finishes."""
    script = tmp_path / "hanging-python"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    return types.SimpleNamespace(executable=str(script))


@pytest.fixture
def hanging_onnx_build(tmp_path, hanging_python, monkeypatch) -> ModelSpec:
    """An ONNX model whose build child never finishes."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setattr(load_children, "sys", hanging_python)
    return ModelSpec(id="m", source=str(model), cpu_backend="onnx")


def test_the_load_deadline_kills_the_onnx_build_child(tmp_path, hanging_onnx_build):
    started = time.monotonic()
    with pytest.raises(ChildTimedOut, match="blitz.loading.child_main"):
        load_children.build_in_child(hanging_onnx_build, Path(hanging_onnx_build.source),
                                     tmp_path / "cache", timeout_s=0.5)
    assert time.monotonic() - started < 5


def test_the_deadline_travels_with_the_load(tmp_path, hanging_onnx_build):
    """No thread-local: the deadline a load is given reaches its children through the
    load itself, and the child that outlives it costs a 424, not a hang."""
    started = time.monotonic()
    with pytest.raises(ModelLoadFailed, match="did not finish within 0.5 s") as caught:
        load_encoder(hanging_onnx_build, cache_dir=tmp_path / "cache", timeout_s=0.5)
    assert time.monotonic() - started < 5 and caught.value.status == 424


def test_the_load_deadline_kills_the_auto_backend_child(tmp_path, hanging_python, monkeypatch):
    spec = ModelSpec(id="m", source=str(tmp_path), cpu_backend="auto")
    monkeypatch.setattr(load_children, "sys", hanging_python)
    started = time.monotonic()
    with pytest.raises(ChildTimedOut, match="blitz.loading.child_main"):
        load_children.choose_in_child(spec, tmp_path, tmp_path / "cache", threads=1,
                                      timeout_s=0.5)
    assert time.monotonic() - started < 5
