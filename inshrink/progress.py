"""A minimal progress bar on stderr, shown only for work that takes more than a moment."""
from __future__ import annotations

import sys
import time


class ProgressBar:
    """Counts processed bytes; draws a bar once ``delay`` seconds have passed.

    Parameters
    ----------
    total : int
        Bytes expected.
    label : str
        Text before the bar.
    enabled : bool
        Draw at all (the CLI passes "stderr is a terminal and not --quiet").
    """

    def __init__(self, total: int, label: str, enabled: bool, delay: float = 0.5) -> None:
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.done = 0
        self._start = time.monotonic()
        self._delay = delay
        self._drawn = 0.0

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.enabled and now - self._start >= self._delay and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        fraction = min(self.done / self.total, 1.0)
        rate = self.done / max(now - self._start, 1e-9) / 1e6
        bar = "#" * int(fraction * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {fraction:6.1%} {rate:8.1f} MB/s")
        sys.stderr.flush()

    def stop(self) -> None:
        """End the bar's line where it stands (an error message follows on its own line)."""
        if self._drawn:
            self._drawn = 0.0
            sys.stderr.write("\n")
            sys.stderr.flush()

    def finish(self) -> None:
        if self._drawn:
            self._draw(time.monotonic())
            self.stop()
