"""Who is asking, and may they: named tokens with scopes (read < operate < admin), stream tickets.

Every route is guarded by `authorize` (create_app refuses a route that is
neither guarded nor listed public). A route's scope is what it declares with
`**needs("operate")` (it shows in /openapi.json as `x-qforge-scope`); a route
that declares nothing needs `read` for GET and `admin` for anything else, so a
new write route is admin-only until someone decides otherwise.

Tokens are looked up on every request (no cache): a revocation holds at once
on every API process. Auth is on once any token has ever existed (or
QFORGE_API_TOKEN is set, which works as one admin token named `api-token`);
before that every request is `anonymous` with every scope, which is why
`qforge api` refuses a non-loopback address in that state.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import math
import secrets
import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from qforge.api.errors import ApiError
from qforge.commands import tokens
from qforge.commands.tokens import SCOPES, Who

bearer = HTTPBearer(auto_error=False, description=(
    "a token from `qforge token create NAME --scope read|operate|admin` (or QFORGE_API_TOKEN)"))

SCOPE_KEY = "x-qforge-scope"
STREAM_PATH = "/events/stream"
# Where a browser may send the token as the password of Basic auth: it cannot
# set a header on a page it navigates to.
BASIC_PATHS = frozenset({"/docs", "/openapi.json"})
API_TOKEN = "api-token"
ANONYMOUS = Who("anonymous", "admin")
TICKET_PURPOSE = "stream"
TICKET_KEY = "stream_ticket"
# An open stream ends at most this long after its token is revoked: it asks again
# every (1 - STREAM_VERDICT_SHARE) of it, and takes an answer asked for at most
# STREAM_VERDICT_SHARE of it earlier (stream_still_allowed).
STREAM_RECHECK_SECONDS = 5.0
STREAM_VERDICT_SHARE = 0.2


def needs(scope: str) -> dict[str, Any]:
    """Route decorator arguments declaring the scope a write route needs."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    return {"openapi_extra": {SCOPE_KEY: scope}}


def needed_scope(route: Any, method: str) -> str:
    declared = (getattr(route, "openapi_extra", None) or {}).get(SCOPE_KEY)
    if declared:
        return declared
    return "read" if method in ("GET", "HEAD") else "admin"


def _unauthorized(message: str, path: str) -> ApiError:
    challenge = 'Basic realm="QForge", charset="UTF-8"' if path in BASIC_PATHS else "Bearer"
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": challenge})


def _basic_password(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[2] or None


def identify(request: Request, supplied: str | None) -> Who:
    """The token `supplied` names (401 if none or not valid while tokens are on)."""
    resources = request.app.state.resources
    expected = resources.settings.api_token
    if expected and supplied and secrets.compare_digest(supplied.encode(), expected.encode()):
        return Who(API_TOKEN, "admin")
    with resources.pool.connection() as conn:
        enabled, who = tokens.authenticate(conn, supplied)
    if who is not None:
        return who
    if not enabled and not expected:
        return ANONYMOUS
    if supplied is None:
        raise _unauthorized("this API needs 'Authorization: Bearer <token>'"
                            " (`qforge token create NAME --scope read|operate|admin`)", request.url.path)
    raise _unauthorized("the token is not valid (unknown or revoked)", request.url.path)


def authorize(request: Request,
              credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> Who:
    """The dependency every guarded route has: 401 without a valid token, 403 when its
    scope is below the route's."""
    path = request.url.path
    supplied = credentials.credentials if credentials is not None else None
    who: Who | None = None
    if supplied is None and path == STREAM_PATH:
        ticket = request.query_params.get("ticket")
        if ticket is not None:
            who = check_ticket(request, ticket)
        elif request.app.state.resources.settings.stream_query_token:
            supplied = request.query_params.get("token")
    if supplied is None and who is None and path in BASIC_PATHS:
        supplied = _basic_password(request)
    if who is None:
        who = identify(request, supplied)
        request.state.secret = supplied  # the database checks it again for token commands
    needed = needed_scope(request.scope.get("route"), request.method)
    if not who.may(needed):
        raise ApiError(403, "forbidden",
                       f"this needs a token with scope '{needed}'; token '{who.name}' has scope"
                       f" '{who.scope}'",
                       [{"needed_scope": needed, "token": who.name, "scope": who.scope}])
    request.state.who = who
    return who


def actor_of(who: Annotated[Who, Depends(authorize)]) -> str:
    """The actor of the events a request writes: its token's name."""
    return who.name


# A route that writes events takes `actor: Actor`.
Actor = Annotated[str, Depends(actor_of)]
Caller = Annotated[Who, Depends(authorize)]


# --------------------------------------------------------------------------- stream tickets
# A ticket is `<payload>.<HMAC-SHA256 of payload>`, both base64url; the payload
# names the token, the purpose and when it expires. Stateless (any API process
# checks it through stream_ticket_mac(), with the key in server_keys that no
# process's role reads) and useless for
# anything but GET /events/stream; it dies with its token.


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _ticket_mac(request: Request, payload: bytes) -> bytes:
    """The ticket's signature, made by the database (stream_ticket_mac): the API's role
    cannot read the key (issue 30), so a stolen API credential cannot forge tickets."""
    with request.app.state.resources.pool.connection() as conn:
        return tokens.stream_ticket_mac(conn, payload)


def issue_ticket(request: Request, who: Who) -> tuple[str, int]:
    """(ticket, seconds it lasts) for the stream, on behalf of `who`."""
    seconds = request.app.state.resources.settings.stream_ticket_seconds
    payload = json.dumps({"t": who.name, "s": who.scope, "p": TICKET_PURPOSE,
                          "exp": math.ceil(time.time() + seconds),
                          "n": secrets.token_hex(8)}, separators=(",", ":")).encode()
    signature = _ticket_mac(request, payload)
    return f"{_b64(payload)}.{_b64(signature)}", seconds


def check_ticket(request: Request, ticket: str) -> Who:
    """The token a ticket was issued to (401 if forged, expired, of another purpose, or its token
    was revoked since), with the token's scope: it opens the stream only (a read route), and the
    stream shows a read token's events redacted (qforge.api.redact)."""
    encoded, _, signature = ticket.partition(".")
    try:
        payload, mac = _unb64(encoded), _unb64(signature)
        valid = hmac.compare_digest(mac, _ticket_mac(request, payload))
        claims = json.loads(payload) if valid else {}
    except (ValueError, binascii.Error):
        valid, claims = False, {}
    if not valid or not isinstance(claims, dict) or claims.get("p") != TICKET_PURPOSE:
        raise _unauthorized("the stream ticket is not valid", request.url.path)
    if not isinstance(claims.get("exp"), int) or claims["exp"] < time.time():
        raise _unauthorized("the stream ticket has expired: ask POST /events/stream-ticket for a new one",
                            request.url.path)
    name = str(claims.get("t"))
    if not token_still_valid(request, name):
        raise _unauthorized(f"token '{name}' was revoked", request.url.path)
    scope = claims.get("s") if claims.get("s") in SCOPES else "read"
    return Who(name, scope)


def token_still_valid(request: Request, name: str) -> bool:
    """Does the token `name` still work (an open stream asks every few seconds)?"""
    resources = request.app.state.resources
    if name == API_TOKEN:
        return bool(resources.settings.api_token)
    with resources.pool.connection() as conn:
        if name == ANONYMOUS.name:
            return not resources.settings.api_token and not tokens.tokens_exist(conn)
        return tokens.is_active(conn, name)


async def stream_still_allowed(request: Request, name: str) -> bool:
    """token_still_valid for an open stream, asked ONCE for all the streams of the same token
    that ask within STREAM_VERDICT_SHARE * STREAM_RECHECK_SECONDS of each other (100 streams
    opened together would otherwise be 100 queries in the same instant, every few seconds,
    from threads that take the GIL from the event loop that is sending the events).
    A stream asks every (1 - share) * STREAM_RECHECK_SECONDS, so the first answer asked after
    a revocation reaches it within STREAM_RECHECK_SECONDS, as before."""
    verdicts = request.app.state.resources.stream_verdicts
    loop = asyncio.get_running_loop()
    now = time.monotonic()
    asked = verdicts.get(name)
    if (asked is None or asked[0] < now - STREAM_VERDICT_SHARE * STREAM_RECHECK_SECONDS
            or asked[1].get_loop() is not loop):
        task = loop.create_task(run_in_threadpool(token_still_valid, request, name))
        # retrieved here too: an error nobody awaited any more is not logged as lost
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        asked = verdicts[name] = (now, task)
    return await asyncio.shield(asked[1])  # one stream going away does not cancel the others' answer


# --------------------------------------------------------------------------- every route guarded

# Routes anyone may call: liveness, and the dashboard's code (no data in it).
PUBLIC_PATHS = frozenset({"/healthz", "/js/states.js", "/favicon.ico"})


def api_routes(app: FastAPI) -> list[Any]:
    """Every API route of the app, each with its effective path, methods and dependant.
    FastAPI 0.165 keeps an included router as one entry of app.router.routes
    (an _IncludedRouter whose effective_candidates() are its routes, prefixes and
    router dependencies applied), so the routers are walked here."""
    found: list[Any] = []

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if isinstance(route, APIRoute) or getattr(route, "original_route", None) is not None:
                if isinstance(getattr(route, "original_route", route), APIRoute):
                    found.append(route)
            elif hasattr(route, "effective_candidates"):
                walk(route.effective_candidates())

    walk(list(app.router.routes))
    return found


def refuse_unguarded(app: FastAPI) -> None:
    """Raise if a route is neither public nor guarded by authorize."""
    for route in api_routes(app):
        guarded = any(dep.call is authorize for dep in route.dependant.dependencies)
        if not guarded and route.path not in PUBLIC_PATHS:
            raise RuntimeError(f"route {sorted(route.methods)} {route.path} is not guarded by"
                               " qforge.api.auth.authorize and not public")
