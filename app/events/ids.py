"""Time-ordered ids (UUIDv7): FIFO among equal-priority jobs of one batch, and
B-tree inserts at the right edge of the primary key instead of random pages."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = [0, 0]  # last millisecond, sequence within it


def new_id() -> uuid.UUID:
    with _lock:
        millis = time.time_ns() // 1_000_000
        if millis <= _last[0]:
            millis, sequence = _last[0], _last[1] + 1
            if sequence >= 1 << 12:  # 4096 ids in one millisecond: borrow the next one
                millis, sequence = millis + 1, 0
        else:
            sequence = 0
        _last[0], _last[1] = millis, sequence
    tail = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (millis << 80) | (0x7 << 76) | (sequence << 64) | (0b10 << 62) | tail
    return uuid.UUID(int=value)
