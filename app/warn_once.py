"""Warnings said at most once per interval for each subject: a refusal that recurs every tick
(a schedule that cannot fire, a queue no worker serves) writes one line a minute, not the log."""

from __future__ import annotations

import logging
import math
import time
from typing import Callable


class OncePerInterval:
    """`warn(subject, text)` logs `text` unless the same subject was warned of within the interval."""

    def __init__(self, logger: logging.Logger, interval_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.log, self.interval, self.clock = logger, interval_seconds, clock
        self.last: dict[str, float] = {}

    def warn(self, subject: str, text: str) -> bool:
        """True when it was logged now."""
        now = self.clock()
        if now - self.last.get(subject, -math.inf) < self.interval:
            return False
        if len(self.last) > 10_000:  # subjects long gone
            self.last = {k: v for k, v in self.last.items() if now - v < self.interval}
        self.last[subject] = now
        self.log.warning("%s (said at most once every %gs)", text, self.interval)
        return True
