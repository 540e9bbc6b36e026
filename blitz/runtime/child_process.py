"""Child processes that cannot outlive their deadline or their parent.

A model load runs some of its work in ``python -m ...`` children (the ONNX build,
``cpu_backend: auto``'s measurements). ``run_child`` runs one such command and returns its
``CompletedProcess``; the child

- **has a deadline**: past ``timeout_s`` it is killed with its whole process group (it
  starts in a session of its own) and ``ChildTimedOut`` is raised. The caller passes
  it: a model load passes what is left of its own deadline (``blitz.loading.opening.Load``;
  a pool's ``load_timeout_s``, ``DEFAULT_TIMEOUT_S`` for the CLI and bulk jobs);
- **dies with its parent**: it starts through ``python -m blitz.runtime.child_process``, a
  trampoline that asks Linux for ``SIGKILL`` when its parent goes
  (``prctl(PR_SET_PDEATHSIG)``, which survives ``exec``), checks the parent did not go
  already, then ``exec``s the command. Not ``preexec_fn``: Python runs that between
  fork and exec, which can deadlock in a process with threads, as a replica is.
  Linux's "parent" is the thread that started the child; ``run_child`` holds that
  thread until the child has ended. Only the child is signalled: one that starts
  children of its own must start them this way too (``run_child`` does).

A killed child leaves no model-cache lock behind: ``blitz.sources.model_cache`` locks with
``flock``, which the kernel drops when the last descriptor of the lock file closes, and a
process's descriptors close when it dies (Python opens them non-inheritable, so a
command the child ``exec``s holds none).

    python -m blitz.runtime.child_process PARENT_PID COMMAND...
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

DEFAULT_TIMEOUT_S = 1800.0  # a load that names no deadline of its own (the CLI, bulk jobs)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ChildTimedOut(TimeoutError):
    """The child ran past its deadline and was killed."""


def run_child(command: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end, capturing its output as text (like ``subprocess.run``
    with ``capture_output=True, text=True``). Raises ``ChildTimedOut`` after killing the
    child and its process group past ``timeout_s``; the child is killed too if this
    thread is interrupted meanwhile, and when this process dies."""
    limit = max(0.0, timeout_s)
    wrapped = [sys.executable, "-m", "blitz.runtime.child_process", str(os.getpid()), *command]
    with subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            child.communicate()
            raise ChildTimedOut(f"{_name(command)} did not finish within "
                                f"{round(limit, 1):g} s; "
                                "killed it and its process group") from None
        except BaseException:
            _kill_group(child)
            raise
    return subprocess.CompletedProcess(list(command), child.returncode, out, err)


def _name(command: Sequence[str]) -> str:
    """The child as a log line names it: the module of ``python -m``, else the program."""
    if len(command) > 2 and command[1] == "-m":
        return command[2]
    return os.path.basename(command[0]) if command else "the child"


def _kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)  # its session's group: grandchildren too
    child.kill()


def _die_with_parent(parent_pid: int) -> None:
    """Ask for SIGKILL when the parent dies (Linux); exit now if it died already."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent went before the death signal was armed
        os._exit(1)


def main(argv: list[str]) -> int:
    _die_with_parent(int(argv[0]))
    os.execvp(argv[1], argv[1:])  # the death signal stays armed across exec


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
