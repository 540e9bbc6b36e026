"""A one-line progress display on stderr (tqdm).

The line is rewritten in place, at most every ``mininterval`` seconds: often on a
terminal, every ``log_every_s`` seconds otherwise (CI logs, pipes) so logs stay short.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


class Progress:
    def __init__(self, stream: TextIO | None = None, log_every_s: float = 5.0):
        self.stream = stream or sys.stderr
        self.mininterval = 0.1 if self.stream.isatty() else log_every_s
        self._bar: tqdm | None = None

    def update(self, line: str) -> None:
        bar = self._show(line)
        bar.update(0)  # redraws once mininterval has passed since the last time

    def done(self, line: str) -> None:
        """End the live line with a final one."""
        self._show(line).close()  # draws the final line
        self._bar = None

    def _show(self, line: str) -> tqdm:
        if self._bar is None:
            self._bar = tqdm(file=self.stream, bar_format="{desc}",
                             mininterval=self.mininterval, dynamic_ncols=True)
        self._bar.set_description_str(line, refresh=False)
        return self._bar


class NoProgress(Progress):
    def __init__(self) -> None:
        super().__init__()

    def update(self, line: str) -> None:
        pass

    def done(self, line: str) -> None:
        pass
