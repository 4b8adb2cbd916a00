"""Time-ordered ids (UUIDv7): FIFO among equal-priority jobs of one batch, and
B-tree inserts at the right edge of the primary key instead of random pages."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_UNKNOWN = uuid.SafeUUID.unknown  # an enum member's lookup is a descriptor call: once, here
_last = [0, 0]  # last millisecond, sequence within it


def new_ids(count: int) -> list[uuid.UUID]:
    """`count` ids, increasing, from one clock read and one random read."""
    with _lock:
        millis = time.time_ns() // 1_000_000
        if millis <= _last[0]:
            millis, sequence = _last[0], _last[1] + 1
        else:
            sequence = 0
        ids = []
        noise = os.urandom(8 * count)
        for index in range(count):
            if sequence >= 1 << 12:  # 4096 ids in one millisecond: borrow the next one
                millis, sequence = millis + 1, 0
            tail = int.from_bytes(noise[8 * index:8 * index + 8], "big") & ((1 << 62) - 1)
            ids.append(_uuid((millis << 80) | (0x7 << 76) | (sequence << 64) | (0b10 << 62) | tail))
            sequence += 1
        _last[0], _last[1] = millis, sequence - 1
    return ids


def _uuid(value: int) -> uuid.UUID:
    """uuid.UUID(int=value) without its argument checks (value is a valid UUIDv7 by
    construction): a third of the cost of enqueueing a job in Python was there."""
    made = object.__new__(uuid.UUID)
    object.__setattr__(made, "int", value)
    object.__setattr__(made, "is_safe", _UNKNOWN)
    return made


def new_id() -> uuid.UUID:
    return new_ids(1)[0]
