"""A one-line progress bar over a sweep's configurations, with an ETA, on stderr.

Drawn only on a terminal (a log file gets no carriage returns). The ETA counts only the
configurations run in this session, so resumed ones do not make the rest look instant.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class SweepProgress:
    """Call `advance` once per finished configuration; `close` ends the line."""

    def __init__(
        self, total: int, *, resumed: int = 0, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.total, self.done, self.failed, self.resumed = total, resumed, 0, resumed
        self.start = time.perf_counter()
        self.drawn = False
        self._draw()

    def advance(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        self._draw()

    def line(self) -> str:
        """'[#####-----] 12/32 configurations, 1 failed  0:41 elapsed, ETA 1:10'."""
        width = 24
        filled = width * self.done // max(self.total, 1)
        text = f"[{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total} configurations"
        if self.failed:
            text += f", {self.failed} failed"
        elapsed = time.perf_counter() - self.start
        text += f"  {_clock(elapsed)} elapsed"
        ran = self.done - self.resumed
        if ran and self.done < self.total:
            text += f", ETA {_clock(elapsed / ran * (self.total - self.done))}"
        return text

    def _draw(self) -> None:
        if not self.enabled:
            return
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _clock(seconds: float) -> str:
    s = int(seconds)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )
