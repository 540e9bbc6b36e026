"""A one-line progress display on stderr.

On a terminal the line is rewritten in place; otherwise (CI logs, pipes) a full line is
written every ``log_every_s`` seconds so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, log_every_s: float = 5.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.log_every_s = log_every_s
        self._last_log = 0.0
        self._width = 0

    def update(self, line: str) -> None:
        if self.tty:
            pad = " " * max(0, self._width - len(line))
            self.stream.write(f"\r{line}{pad}")
            self._width = len(line)
            self.stream.flush()
        elif time.monotonic() - self._last_log >= self.log_every_s:
            self._last_log = time.monotonic()
            self.stream.write(line + "\n")
            self.stream.flush()

    def done(self, line: str) -> None:
        """End the live line with a final one."""
        if self.tty:
            self.update(line)
            self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._width = 0
        self._last_log = 0.0


class NoProgress(Progress):
    def __init__(self) -> None:
        super().__init__()

    def update(self, line: str) -> None:
        pass

    def done(self, line: str) -> None:
        pass
