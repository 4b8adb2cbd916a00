"""Progress of long command-line work on stderr: a bar with counts, rate and ETA on a terminal;
off a terminal nothing (a script's stderr stays its own), unless QFORGE_PROGRESS=plain asks for a
plain line every few seconds (logs, CI); QFORGE_PROGRESS=off silences the bar too. Work that ends
within a second shows nothing at all.

The one progress display of every long command (replay, archive, pack, audit verify, bulk cancel
and retry): the standard library is enough, so no dependency for it."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

BAR_WIDTH = 24


def _clock_text(seconds: float) -> str:
    seconds = int(max(seconds, 0) + 0.5)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """`Progress("replay", total=n, unit="events")`; report with update(done[, total]),
    advance(n), or call it as `progress(done, total)` (the replay functions' callback).
    As a context manager it closes the bar (or prints the last line) at the end."""

    def __init__(self, label: str, total: int | None = None, *, unit: str = "items",
                 stream: TextIO | None = None, every: float | None = None, quiet_for: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, plain: bool | None = None):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        wanted = os.environ.get("QFORGE_PROGRESS", "").strip().lower()
        plain = wanted == "plain" if plain is None else plain
        # off a terminal only when asked for; never when switched off
        self.silent = wanted == "off" or (not self.tty and not plain)
        self.every = every if every is not None else (0.2 if self.tty else 5.0)
        self.quiet_for, self.clock = quiet_for, clock
        self.started = clock()
        self.last_shown: float | None = None
        self.done = 0
        self.lock = threading.Lock()

    def __call__(self, done: int, total: int | None = None) -> None:
        self.update(done, total)

    def advance(self, count: int = 1) -> None:
        with self.lock:
            self.done += count
            self._maybe_show()

    def update(self, done: int, total: int | None = None) -> None:
        with self.lock:
            self.done = done
            if total is not None:
                self.total = total
            self._maybe_show()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The final state, if anything was shown at all (short work stays silent)."""
        with self.lock:
            if self.last_shown is not None:
                self._show(self.clock(), final=True)

    def _maybe_show(self) -> None:
        if self.silent:
            return
        now = self.clock()
        if now - self.started < self.quiet_for:
            return
        if self.last_shown is not None and now - self.last_shown < self.every:
            return
        self._show(now)

    def _show(self, now: float, final: bool = False) -> None:
        self.last_shown = now
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        total = self.total
        eta = (total - self.done) / rate if total and rate > 0 and self.done < total else None
        if self.tty:
            parts = [self.label]
            if total:
                filled = min(BAR_WIDTH, int(BAR_WIDTH * self.done / total))
                parts.append(f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * self.done / total:3.0f}%")
                parts.append(f"{self.done:,}/{total:,} {self.unit}")
            else:
                parts.append(f"{self.done:,} {self.unit}")
            parts.append(f"{rate:,.0f}/s")
            parts.append(f"ETA {_clock_text(eta)}" if eta is not None else f"{_clock_text(elapsed)}")
            self.stream.write("\r\x1b[K" + "  ".join(parts) + ("\n" if final else ""))
        else:
            amount = (f"{self.done:,} of {total:,} {self.unit} ({100 * self.done / total:.0f} %)" if total
                      else f"{self.done:,} {self.unit}")
            tail = f", ETA {_clock_text(eta)}" if eta is not None else f", {_clock_text(elapsed)} elapsed"
            self.stream.write(f"{self.label}: {amount}, {rate:,.0f} {self.unit}/s{tail}\n")
        self.stream.flush()
