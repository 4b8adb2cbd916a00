"""What the built-in shell and http tasks share: a number of seconds read from a payload, bounded quotes of output."""

from __future__ import annotations

import math

from qforge.workers.tasks import TaskError

OUTPUT_TAIL_BYTES = 64 * 1024  # per stream: enough to debug, bounded whatever a command prints
MESSAGE_TAIL_CHARS = 2000  # of stderr / an error body, quoted in the failure message


def payload_seconds(payload: dict, field: str) -> float | None:
    value = payload.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise TaskError(f"'{field}' must be a positive number of seconds, got {value!r}")
    return float(value)


def message_tail(text: str) -> str:
    text = text.strip()
    if not text:
        return "(empty)"
    return text if len(text) <= MESSAGE_TAIL_CHARS else "..." + text[-MESSAGE_TAIL_CHARS:]

