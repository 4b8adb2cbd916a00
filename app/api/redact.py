"""Read means read: secret-looking fields are shown as *** to read tokens, in every response.

A read token may watch the system (dashboards, monitoring) but not learn what
operate tokens put into payloads to reach other systems: an http step's
`headers.Authorization`, a `Cookie`, a shell step's `env`. So for a request
authorized with scope `read` (a token, or a stream ticket of a read token) the
value of every object member named Authorization, Proxy-Authorization, Cookie,
Set-Cookie or one of QFORGE_REDACT_FIELDS (any case), and every value of an
object named `env`, becomes "***": in jobs, workflows, definitions, schedules,
searches, /events and the SSE stream alike. It is done here, once, on the way
out (ASGI middleware), so no route can forget it; operate and admin see the
stored values. Proofs keep their hashes: see `redact_proof`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qforge.api.asgi import HttpMiddleware

MASK = "***"
ALWAYS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
ENV_KEY = "env"  # a shell step's environment: every value hidden


def redact(value: Any, names: frozenset[str]) -> tuple[Any, bool]:
    """(value with secret-looking members masked, whether anything was masked)."""
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            lowered = key.lower() if isinstance(key, str) else key
            if lowered in names:
                out[key], changed = MASK, True
            elif lowered == ENV_KEY and isinstance(item, dict):
                out[key] = {name: MASK for name in item}
                changed = changed or bool(item)
            else:
                out[key], masked = redact(item, names)
                changed = changed or masked
        return out, changed
    if isinstance(value, list):
        changed = False
        items = []
        for item in value:
            masked_item, masked = redact(item, names)
            items.append(masked_item)
            changed = changed or masked
        return items, changed
    return value, False


def redact_proof(proof: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """A proof for a read token. An event hash covers the exact bytes of the stored `data`, so a
    masked event cannot be re-hashed by anyone: such an event keeps its `hash`, `checkpoint` and
    `merkle_path` (its place in the chain and in the checkpoints still verifies, and so does the
    event after it, which chains to that hash), and says `"redacted": true` with the masked
    `data_text`; tools/verify_audit_proof.py then checks everything but that event's own contents
    and lists it as withheld. `status` is the server's check of the whole proof, made before."""
    events = []
    for event in proof["events"]:
        data = json.loads(event["data_text"]) if event.get("data_text") else None
        masked, changed = redact(data, names)
        if changed:
            event = {**event, "data_text": json.dumps(masked), "redacted": True}
        events.append(event)
    return {**proof, "events": events}


def wants_redaction(scope: Scope) -> bool:
    who = (scope.get("state") or {}).get("who")
    return who is not None and getattr(who, "scope", None) == "read"


class RedactForReaders(HttpMiddleware):
    """Masks secret-looking members of JSON responses and SSE `data:` lines for read tokens.
    Costs nothing for other callers: the response passes untouched."""

    def __init__(self, app: ASGIApp, names: frozenset[str]):
        super().__init__(app)
        self.names = ALWAYS | names

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})  # shared with the route's request.state (authorize sets `who`)
        mode: list[str] = []  # "json" | "sse" | "pass", decided at the response's start
        start: list[Message] = []
        body: list[bytes] = []

        async def send_redacted(message: Message) -> None:
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                if not wants_redaction(scope):
                    mode.append("pass")
                elif content_type.startswith(b"application/json"):
                    mode.append("json")
                elif content_type.startswith(b"text/event-stream"):
                    mode.append("sse")
                else:
                    mode.append("pass")
                if mode[0] == "json":
                    start.append(message)  # sent with the body: its length changes
                    return
                await send(message)
                return
            if message["type"] != "http.response.body" or not mode or mode[0] == "pass":
                await send(message)
                return
            if mode[0] == "sse":
                await send({**message, "body": self._sse(message.get("body", b""))})
                return
            body.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            payload = self._json(b"".join(body))
            headers = [(k, v) for k, v in start[0].get("headers") or [] if k != b"content-length"]
            headers.append((b"content-length", str(len(payload)).encode()))
            await send({**start[0], "headers": headers})
            await send({"type": "http.response.body", "body": payload, "more_body": False})

        await self.app(scope, receive, send_redacted)

    def _json(self, raw: bytes) -> bytes:
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
        masked, changed = redact(value, self.names)
        return json.dumps(masked).encode() if changed else raw

    def _sse(self, chunk: bytes) -> bytes:
        if b"data:" not in chunk:
            return chunk
        lines = chunk.split(b"\n")
        for index, line in enumerate(lines):
            if line.startswith(b"data: "):
                ending = b"\r" if line.endswith(b"\r") else b""
                lines[index] = b"data: " + self._json(line[6:].rstrip(b"\r")) + ending
        return b"\n".join(lines)
