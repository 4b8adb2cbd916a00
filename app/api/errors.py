"""Every error leaves the API as {"error", "message", "details"}; no input produces a 500."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from qforge.api.asgi import HttpMiddleware
from qforge.commands.errors import CommandError, Conflict, Invalid, NotAllowed, NotFound
from qforge.commands.specs import NAME_PATTERN, NAME_RULE

log = logging.getLogger("qforge.api")

COMMAND_STATUS = {NotFound: 404, Conflict: 409, Invalid: 422, NotAllowed: 403}
HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
              413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid", 429: "too_many_requests",
              503: "unavailable"}
# Routes of the pod orchestrator's API answer bad input with 400, as that system did.
COMPAT_400_PATHS = ("/workflow",)


class ApiError(Exception):
    """An error a route raises on purpose, with its status."""

    def __init__(self, status: int, code: str, message: str, details: list | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details = details or []
        self.headers = headers


def error_response(status: int, code: str, message: str, details: list | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, "details": details or []},
                        status_code=status, headers=headers)


BODY_UNION_TAGS = ("WorkflowSpec", "CodeWorkflowSpec")


def _location(loc: tuple | list) -> str:
    """("body", "steps", 0, "task") -> "steps[0].task"; query/path parameters keep their name."""
    parts = [p for p in loc if p not in ("body",)]
    if parts and parts[0] in BODY_UNION_TAGS:  # POST /workflows: which of its two bodies
        parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in ("query", "path", "header") and not text:
            continue
        else:
            text += ("." if text else "") + str(part)
    return text or "body"


def plain_message(error: dict[str, Any]) -> str:
    """A validation error's sentence without pydantic's "Value error, " in front of our own words;
    a name that breaks NAME_PATTERN says which characters are allowed."""
    if error.get("type") == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == NAME_PATTERN:
        return f"must be {NAME_RULE}"
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    details = []
    for error in exc.errors():
        loc = list(error.get("loc", ()))
        details.append({"field": _location(loc), "in": loc[0] if loc else "body",
                        "message": plain_message(error),
                        "type": str(error.get("type", "invalid"))})
    return details


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    details = _validation_details(exc)
    if any(d["type"] == "json_invalid" for d in details):
        return error_response(400, "invalid_json", "the request body is not valid JSON: "
                              + "; ".join(d["message"] for d in details), details)
    # A malformed id in a path names nothing that exists: 404, naming the parameter.
    if details and all(d["in"] == "path" for d in details):
        return error_response(404, "not_found", "; ".join(
            f"{d['field']} is not a valid id ({d['message']})" for d in details), details)
    message = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid request"
    if request.url.path in COMPAT_400_PATHS:
        return error_response(400, "bad_request", message, details)
    return error_response(422, "invalid", message, details)


async def _on_model_error(request: Request, exc: ValidationError) -> JSONResponse:
    # A model built inside a route (e.g. the compat route's WorkflowSpec).
    details = [{"field": _location(list(e.get("loc", ()))), "in": "body",
                "message": plain_message(e), "type": str(e.get("type"))} for e in exc.errors()]
    status = 400 if request.url.path in COMPAT_400_PATHS else 422
    return error_response(status, "invalid" if status == 422 else "bad_request",
                          "; ".join(f"{d['field']}: {d['message']}" for d in details), details)


async def _on_api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)


async def _on_command_error(request: Request, exc: CommandError) -> JSONResponse:
    status = next((s for cls, s in COMMAND_STATUS.items() if isinstance(exc, cls)), 400)
    if isinstance(exc, Invalid) and request.url.path in COMPAT_400_PATHS:
        status = 400
    return error_response(status, exc.code, exc.message, list(exc.details))


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = HTTP_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404 and message == "Not Found":
        message = f"no such resource: {request.method} {request.url.path}"
    if exc.status_code == 405 and message == "Method Not Allowed":
        allowed = (getattr(exc, "headers", None) or {}).get("Allow")
        message = f"{request.method} is not allowed on {request.url.path}" + (
            f"; it takes {allowed}" if allowed else "")
    return error_response(exc.status_code, code, message, headers=getattr(exc, "headers", None))


async def _on_data_error(request: Request, exc: psycopg.DataError) -> JSONResponse:
    # Values PostgreSQL cannot store (e.g. a NUL character) that slipped past the models.
    return error_response(422, "invalid", f"a value cannot be stored: {exc}".splitlines()[0])


async def _on_statement_timeout(request: Request, exc: psycopg.errors.QueryCanceled) -> JSONResponse:
    # QFORGE_API_STATEMENT_TIMEOUT_SECONDS ended the request's query: the request asked for too much
    # at once (a 4xx: asking again the same way fails the same way).
    limit = request.app.state.resources.settings.api_statement_timeout_seconds
    return error_response(422, "statement_timeout",
                          f"the request's query ran longer than QFORGE_API_STATEMENT_TIMEOUT_SECONDS ({limit:g} s)"
                          " and was stopped: narrow it (filters, a smaller limit, a later cursor)",
                          [{"limit": "QFORGE_API_STATEMENT_TIMEOUT_SECONDS", "value": limit}])


async def _on_database_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return error_response(503, "unavailable", "the database is not reachable right now",
                          headers={"Retry-After": "1"})


class Unexpected(HttpMiddleware):
    """Any exception no handler above took becomes a 500 with the JSON error body, here,
    without raising further. (An `Exception` handler of Starlette's would answer the same body
    but then re-raise it to the server, which logs "Exception in ASGI application" and closes
    the keep-alive connection under the client's next request.) When the response had already
    begun there is nothing to answer: the error is logged and the connection ends."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            response = error_response(500, "internal", "an unexpected error occurred; it has been logged")
            await response(scope, receive, send)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(ValidationError, _on_model_error)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(CommandError, _on_command_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(psycopg.DataError, _on_data_error)
    app.add_exception_handler(psycopg.errors.QueryCanceled, _on_statement_timeout)
    app.add_exception_handler(PoolTimeout, _on_database_down)
    app.add_exception_handler(psycopg.OperationalError, _on_database_down)
    # Innermost of the middlewares, so the 500 gets the security headers like any answer.
    app.add_middleware(Unexpected)
