"""The one progress bar: `label [####      ] done/total`, on one line of stderr, drawn only on a terminal.

It knows a total, a done count and a label, nothing of what is counted: a trajectory counts steps, a
sweep could count cells (unit=" cells", eta=True, a note naming the last one).
"""
from __future__ import annotations

import sys
import time

WIDTH = 30  # characters of the bar itself


def hms(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """done/total under a label. enabled None: only when stderr is a terminal.

    min_interval: seconds between redraws (the last count is always drawn, once); eta: add the time left
    (or, when done, the time taken) from the rate since the bar was made; pad: the line's width, so a
    shorter line covers a longer one drawn before."""

    def __init__(self, total: int, label: str, enabled: bool | None = None, *, done: int = 0, unit: str = "",
                 eta: bool = False, pad: int = 0, min_interval: float = 0.1):
        self.total, self.label, self.done, self.unit = total, label, done, unit
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.eta, self.pad, self.min_interval = eta, pad, min_interval
        self.start_done, self.t0 = done, time.monotonic()
        self.last = 0.0
        self.finished = False

    def update(self, done: int, note: str = "") -> None:
        """Draw `done` of the total (throttled to min_interval, the total always)."""
        self.done = done
        now = time.monotonic()
        if not self.enabled or self.finished or (now - self.last < self.min_interval and done < self.total):
            return
        self.last = now
        frac = done / self.total if self.total else 1.0
        line = f"\r{self.label} [{'#' * int(WIDTH * frac):<{WIDTH}}] {done}/{self.total}{self.unit}"
        if self.eta:
            line += f"  {self._time_left(now)}"
        if note:
            line += f"  {note}"
        sys.stderr.write(line.ljust(self.pad))
        if done >= self.total:
            self.finished = True
            sys.stderr.write("\n")
        sys.stderr.flush()

    def advance(self, note: str = "") -> None:
        """One more done."""
        self.update(self.done + 1, note)

    def _time_left(self, now: float) -> str:
        counted, elapsed = self.done - self.start_done, now - self.t0
        if self.done >= self.total:
            return f"took {hms(elapsed)}"
        return f"ETA {hms(elapsed / counted * (self.total - self.done)) if counted else '--:--'}"
