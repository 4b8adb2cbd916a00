"""Read-your-writes for clients of an API that reads from a hot standby.

After a write, the response carries the WAL position of its commit in an
`X-QForge-LSN` header and a `qforge_lsn` cookie. A read that brings either back
(or any read of the API process that made the write: it remembers its newest
one) is served by the standby only once the standby has replayed that far,
waiting up to QFORGE_READ_WAIT_SECONDS; otherwise by the primary. So a client
reads its own writes whichever API replica it reaches, and the dashboard (a
browser: the cookie) too. Without QFORGE_READ_DATABASE_URL none of this runs.
"""

from __future__ import annotations

from fastapi import Request
from starlette.types import Message, Receive, Scope, Send

from qforge.api.asgi import HttpMiddleware
from qforge.replication import format_lsn, parse_lsn

HEADER = "X-QForge-LSN"
COOKIE = "qforge_lsn"
_SCOPE_KEY = "qforge.write_lsn"


def required_lsn(request: Request) -> int:
    """The newest write position the client says it has seen (header, else cookie); 0 if none."""
    lsn = parse_lsn(request.headers.get(HEADER))
    if lsn is None:
        lsn = parse_lsn(request.cookies.get(COOKIE))
    return lsn or 0


def record_write(request: Request, lsn: int) -> None:
    """Remember the request's write position; WriteLsnHeaders puts it on the response."""
    holder = request.scope.get(_SCOPE_KEY)
    if isinstance(holder, dict):
        holder["lsn"] = max(holder.get("lsn", 0), lsn)


class WriteLsnHeaders(HttpMiddleware):
    """Adds X-QForge-LSN and the qforge_lsn cookie to the response of a write that recorded one.

    ASGI middleware, because the position is known only after the route's
    transaction committed, when FastAPI has already built the response headers.
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        holder: dict[str, int] = {}
        scope[_SCOPE_KEY] = holder

        async def send_with_lsn(message: Message) -> None:
            if message["type"] == "http.response.start" and holder.get("lsn"):
                lsn = format_lsn(holder["lsn"]).encode()
                message = {**message, "headers": [
                    *message.get("headers", []), (HEADER.lower().encode(), lsn),
                    (b"set-cookie", b"%s=%s; Path=/; SameSite=Lax; HttpOnly" % (COOKIE.encode(), lsn))]}
            await send(message)

        await self.app(scope, receive, send_with_lsn)
