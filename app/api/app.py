"""The FastAPI application: routers, error handlers, the body limit, auth, security headers and the dashboard."""

from __future__ import annotations

import contextlib
from importlib import resources
from pathlib import Path
from typing import AsyncIterator

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
import swagger_ui_bundle

from qforge import tracing
from qforge.api import dashboard_states, errors
from qforge.api.routes import (compat, definitions, events, executions, jobs, keys, operations, queues, schedules,
                               stats, tokens, workflows)
from qforge.api.asgi import HttpMiddleware
from qforge.api.auth import api_routes, authorize, refuse_unguarded
from qforge.api.consistency import WriteLsnHeaders
from qforge.api.deps import Resources
from qforge.api.errors import error_response
from qforge.api.guard import BrowserGuard, allowed_hosts
from qforge.api.metrics import make_registry
from qforge.api.redact import RedactForReaders
from qforge.settings import Settings, get_settings

WEB_DIR = Path(str(resources.files("qforge.web")))


def is_json(content_type: bytes) -> bool:
    """application/json, with parameters (charset=...) or as a +json type."""
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class BodyLimit(HttpMiddleware):
    """413 for a body over the limit, by its Content-Length or by counting what arrives
    (a chunked body has no length); 415 for a body that is not JSON. The body is read here,
    at most limit + one chunk, then handed on to the app unchanged."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await self._reject(scope, receive, send, 400, "bad_request",
                                   "Content-Length is not a number")
                return
            if int(declared) > self.max_bytes:
                await self._reject(scope, receive, send, 413, "payload_too_large",
                                   f"the body has {int(declared)} bytes; the limit is "
                                   f"{self.max_bytes} (QFORGE_MAX_BODY_BYTES)")
                return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send, 413, "payload_too_large",
                                   f"the body is over the limit of {self.max_bytes} bytes "
                                   "(QFORGE_MAX_BODY_BYTES)")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        if size and not is_json(headers.get(b"content-type", b"")):
            # The API reads only JSON bodies: say so, rather than what a parser makes of text.
            got = headers.get(b"content-type", b"").decode("latin-1") or "no Content-Type"
            await self._reject(scope, receive, send, 415, "unsupported_media_type",
                               f"the body must be JSON sent with Content-Type: application/json (got {got})")
            return
        await self.app(scope, _replay([body], receive), send)

    @staticmethod
    async def _reject(scope: Scope, receive: Receive, send: Send, status: int, code: str,
                      message: str) -> None:
        response = error_response(status, code, message, headers={"Connection": "close"})
        await response(scope, receive, send)


# Sent with every response. The dashboard loads only its own scripts and styles
# (ES modules, one stylesheet; the DAG and charts are built with the DOM, and
# constructed stylesheets need no inline-style allowance); nothing may frame it.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; "
                                 b"img-src 'self' data:; connect-src 'self'; object-src 'none'; "
                                 b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
# Swagger UI (/docs): its files come from the swagger-ui-bundle-v2 package (no CDN, so it
# works offline) under /docs/static, and web/docs.js starts it (no inline script), so the
# page runs under SECURITY_HEADERS' policy like the dashboard.
DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>QForge API</title>
  <link rel="icon" href="/favicon.svg" type="image/svg+xml">
  <link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/static/swagger-ui-bundle.js"></script>
  <script src="/docs.js"></script>
</body>
</html>
"""


class SecurityHeaders(HttpMiddleware):
    """Adds SECURITY_HEADERS to every HTTP response (a header the route set itself wins)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Dashboard:
    """The dashboard's files, behind every API route. A path that an API route serves with
    other methods (GET on POST /jobs/{id}/cancel) answers 405 naming them, not the files' 404."""

    def __init__(self, app: FastAPI):
        self.app = app
        self.files = StaticFiles(directory=WEB_DIR, html=True)
        self.routes: list | None = None  # the API's routes, once they are all there

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.routes is None:
                self.routes = api_routes(self.app)
            allowed = sorted({method for route in self.routes if route.matches(scope)[0] == Match.PARTIAL
                              for method in route.methods or ()})
            if allowed:
                raise StarletteHTTPException(405, headers={"Allow": ", ".join(allowed)})
        await self.files(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def create_app(database_url: str | None = None, *, settings: Settings | None = None,
               bound_host: str | None = None, readonly_url: str | None = None) -> FastAPI:
    """The API. `database_url` overrides QFORGE_DATABASE_URL; neither means the embedded
    server. `readonly_url`: the read-only role's, for the reads and the event stream (else
    QFORGE_READONLY_DATABASE_URL, else they use `database_url` too). The database is
    reached on first use, not at startup. `bound_host` (default QFORGE_HOST) is one of the
    hosts a request may name when QFORGE_ALLOWED_HOSTS is empty."""
    settings = settings or get_settings()
    resources = Resources(settings, database_url, readonly_url=readonly_url or settings.readonly_database_url)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await resources.aclose()

    app = FastAPI(
        title="QForge", version="0.1.0", lifespan=lifespan,
        # Our own /docs and /openapi.json below, behind the read scope.
        docs_url=None, redoc_url=None, openapi_url=None,
        description=("Event-sourced job queue and DAG workflow orchestrator on PostgreSQL. "
                     "Errors are `{\"error\", \"message\", \"details\"}`; lists are "
                     "`{\"items\", \"next\"}`; histories are `{\"events\"}`."),
    )
    app.state.resources = resources
    tracing.instrument(app)  # server spans, when this process traces (qforge api configures it)
    app.state.metrics = make_registry(resources)
    errors.install(app)
    protected = [Depends(authorize)]  # every route but the health checks and code (dashboard, Swagger UI)
    _include_routers(app, protected)
    _add_docs(app, protected)
    _add_dashboard(app)
    _add_middleware(app, settings, bound_host)
    refuse_unguarded(app)
    if not settings.api_token:
        _optional_security(app)
    return app


def _include_routers(app: FastAPI, protected: list) -> None:
    """Every resource's router behind the token, and the health checks without one."""
    for router in (jobs.router, workflows.router, definitions.router, compat.router, events.router,
                   executions.router, operations.router, tokens.router, queues.router, schedules.router,
                   stats.router, keys.router):
        app.include_router(router, dependencies=protected)
    app.include_router(operations.health_router)


def _add_docs(app: FastAPI, protected: list) -> None:
    """/openapi.json and Swagger UI (/docs) behind the read scope; Swagger UI's own files without."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=protected)
    def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=protected)
    def docs() -> Response:
        """Swagger UI; a browser is asked for the token by Basic auth (any user name)."""
        return HTMLResponse(DOCS_PAGE)

    # Swagger UI's own files: code, like the dashboard's, so no token.
    app.mount("/docs/static", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger-ui")


def _add_dashboard(app: FastAPI) -> None:
    """The dashboard: its generated states module, the favicon and, last, its files."""
    states_js = dashboard_states.module()

    @app.get("/js/states.js", include_in_schema=False)
    def states_module() -> Response:
        """The dashboard's statuses and colours, from the state machine (no token: it is code)."""
        return Response(states_js, media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        for name in ("favicon.ico", "favicon.svg", "favicon.png"):
            path = WEB_DIR / name
            if path.is_file():
                return FileResponse(path)
        return Response(status_code=204)

    if WEB_DIR.is_dir():
        # Last, so every API route wins; the page asks for the token itself.
        app.mount("/", Dashboard(app), name="dashboard")


def _add_middleware(app: FastAPI, settings: Settings, bound_host: str | None) -> None:
    """In this order: each one added wraps those before it, so SecurityHeaders runs first."""
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RedactForReaders, names=settings.redact_names)
    if settings.read_database_url:
        app.add_middleware(WriteLsnHeaders)  # X-QForge-LSN on writes: read-your-writes via a standby
    app.add_middleware(BrowserGuard, hosts=allowed_hosts(settings.allowed_hosts, bound_host or settings.host))
    app.add_middleware(SecurityHeaders)


def _optional_security(app: FastAPI) -> None:
    """Until a token exists the bearer token is optional: say so in /openapi.json
    (an empty requirement object means "no credentials needed")."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    if isinstance(operation, dict) and operation.get("security"):
                        operation["security"] = [*operation["security"], {}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
