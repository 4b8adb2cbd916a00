"""Progress of long command-line work on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressPrinter:
    """Progress lines on stderr, at most one per `every` seconds, none for short runs."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, every: float = 1.0):
        self.label, self.stream, self.every = label, stream, every
        self.started = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.started < self.every:
            return  # a short run needs no progress report
        if now - self.last < self.every and done < total:
            return
        self.last = now
        rate = done / (now - self.started) if now > self.started else 0.0
        share = 100 * done / total if total else 100
        print(f"{self.label}: {done:,} of {total:,} events ({share:.0f} %), {rate:,.0f} events/s",
              file=self.stream, flush=True)
