"""A queue of priority levels with aging: higher first, FIFO within a level, none starved.

``AgingQueue`` keeps one FIFO line per level (0 first). An entry's *effective* level is
its own, less one for every ``aging_s`` it has waited (never below 0): a low entry that
waited ``aging_s`` competes as normal, after twice that as high. The next entry is the
head with the best (effective level, arrival) of all the lines' heads. Within a line the
head has waited longest, so it is also that line's best: choosing looks at one head per
level, O(levels), whatever the length. So an entry waits at most ``level x aging_s``
plus the time to serve what arrived before it, however much higher work keeps coming.

``shed`` makes room for an arrival of some level by taking out the newest entries of
worse levels (from the lines' tails, O(1) each) that have not aged up to it, or none when
they cannot make the room: bounded queues drop bulk work first, never the request that
waited longest, and never for nothing.

The queue knows nothing of callers: ``best`` and ``shed`` take a ``gone`` predicate, and
an entry whose caller has left is dropped when it reaches a head (or a tail). Its owner
says when one leaves (``left``): once such dead entries outnumber the live ones, every line
is compacted (O(held), so O(1) per departure amortized). A storm of callers that queue and
leave while the head does not move (a long batch running) therefore holds at most about
twice the live entries, never a deque that grows with every departure.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

E = TypeVar("E")


class Head(NamedTuple, Generic[E]):
    """The entry ``best`` chose: its own level (its line), the level it competes at now,
    when it arrived (the queue's clock) and the entry."""

    line: int
    level: int
    since: float
    entry: E


class AgingQueue(Generic[E]):
    def __init__(self, levels: int, aging_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if levels < 1 or aging_s <= 0:
            raise ValueError("levels must be at least 1 and aging_s over 0")
        self.aging_s = aging_s
        self._clock = clock
        self._lines: list[deque[tuple[int, float, E]]] = [deque() for _ in range(levels)]
        self._arrivals = itertools.count()  # ties between lines go to the first arrival
        self._dead = 0  # entries held whose callers have left (``left``), not yet dropped

    def __len__(self) -> int:
        """Entries held, those whose callers have gone but not yet been dropped included."""
        return sum(len(line) for line in self._lines)

    @property
    def dead(self) -> int:
        """Entries held whose callers have left, as ``left`` counted them."""
        return self._dead

    def left(self, gone: Callable[[E], bool]) -> None:
        """An entry still held has just become ``gone``: counted, and when the dead then
        outnumber the live, every line loses its dead (order kept)."""
        self._dead += 1
        if 2 * self._dead > len(self):
            for number, line in enumerate(self._lines):
                self._lines[number] = deque(held for held in line if not gone(held[2]))
            self._dead = 0

    def _dropped(self) -> None:
        self._dead = max(0, self._dead - 1)

    def push(self, entry: E, level: int) -> None:
        """``entry`` at the back of ``level``'s line (clamped to the levels there are)."""
        line = min(max(level, 0), len(self._lines) - 1)
        self._lines[line].append((next(self._arrivals), self._clock(), entry))

    def effective(self, level: int, waited_s: float) -> int:
        """The level an entry of ``level`` competes at after waiting ``waited_s``."""
        return max(0, level - int(waited_s // self.aging_s))

    def best(self, gone: Callable[[E], bool]) -> Head[E] | None:
        """The entry to serve next (left in the queue: ``pop`` takes it), or None when
        none waits; entries ``gone`` says have left are dropped on the way."""
        now = self._clock()
        chosen: Head[E] | None = None
        chosen_key = (0, 0)
        for line_no, line in enumerate(self._lines):
            while line and gone(line[0][2]):
                line.popleft()
                self._dropped()
            if not line:
                continue
            arrival, since, entry = line[0]
            level = line_no - int((now - since) // self.aging_s)  # ``effective``, inline:
            key = (level if level > 0 else 0, arrival)  # the hot path of every batch
            if chosen is None or key < chosen_key:
                chosen, chosen_key = Head(line_no, key[0], since, entry), key
        return chosen

    def pop(self, head: Head[E]) -> None:
        """Take ``head`` (just returned by ``best``) out of the queue."""
        taken = self._lines[head.line].popleft()
        assert taken[2] is head.entry, "pop takes the head best returned"

    def shed(self, level: int, needed: int, units: Callable[[E], int],
             gone: Callable[[E], bool]) -> list[E]:
        """Take out and return the newest entries of levels worse than ``level`` that still
        compete below it, worst level first, until their ``units`` reach ``needed``; none
        at all when they cannot (nothing is refused for a room that would not be made).
        Entries ``gone`` says have left count for nothing and are dropped on the way."""
        now = self._clock()
        take: list[int] = []  # per line, from the worst: how many from its tail
        found = 0
        for line_no in range(len(self._lines) - 1, level, -1):
            count = 0
            for _, since, entry in reversed(self._lines[line_no]):
                if found >= needed:
                    break
                if not gone(entry):
                    if self.effective(line_no, now - since) <= level:
                        break  # the newest has aged up to it: so has everything before it
                    found += units(entry)
                count += 1
            take.append(count)
        if found < needed:
            return []
        shed: list[E] = []
        for line_no, count in zip(range(len(self._lines) - 1, level, -1), take, strict=True):
            line = self._lines[line_no]
            for _ in range(count):
                entry = line.pop()[2]
                if not gone(entry):
                    shed.append(entry)
                else:
                    self._dropped()
        return shed
