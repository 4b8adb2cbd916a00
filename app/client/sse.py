"""Server-Sent Events, read line by line: the part of the format GET /events/stream sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qforge.api import models
from qforge.client.errors import ApiError

# Reconnect attempts of events() in a row without receiving anything before it gives up.
MAX_RECONNECTS = 10


@dataclass
class SseParser:
    """Feed lines; `feed` returns a finished message (id, event, data) at each blank line."""

    event_id: str | None = None
    event: str | None = None
    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str | None, str | None, str] | None:
        if line == "":
            if not self.data:
                self.event = None
                return None  # a keep-alive or a comment block
            message = (self.event_id, self.event, "\n".join(self.data))
            self.event, self.data = None, []
            return message
        if line.startswith(":"):
            return None  # comment (ping)
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self.event_id = value
        elif name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None

    def read(self, line: str) -> tuple[str | None, Any] | None:
        """(cursor, typed event) when `line` ends a message; None otherwise."""
        message = self.feed(line)
        if message is None:
            return None
        event_id, _, data = message
        return event_id, models.Event.model_validate_json(data).root


@dataclass
class Resume:
    """Where events() stands: the last cursor received, and drops in a row since."""

    last: str | int | None
    filters: dict[str, Any]
    failures: int = 0

    def __post_init__(self) -> None:
        # A cursor is a string on the wire; events(after=0) means the cursor "0" (the beginning).
        if self.last is not None:
            self.last = str(self.last)

    def request(self) -> dict[str, Any]:
        """The stream request's params and headers: from the last event received (Last-Event-ID wins
        on the server; ?after= says the same), or the live tail when nothing came yet."""
        from qforge.client.routes import query

        headers = {"Last-Event-ID": self.last} if self.last is not None else {}
        return {"params": query(after=self.last, **self.filters), "headers": headers}

    def received(self, cursor: str | None) -> None:
        self.last, self.failures = cursor, 0

    def read(self, parser: SseParser, line: str) -> Any | None:
        """The typed event `line` ends (its cursor noted as received), else None."""
        found = parser.read(line)
        if found is None:
            return None
        self.received(found[0])
        return found[1]

    def dropped(self) -> None:
        self.failures += 1
        if self.failures > MAX_RECONNECTS:
            raise ApiError(503, "unavailable", f"the event stream dropped {MAX_RECONNECTS} times in a row")
