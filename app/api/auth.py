"""QFORGE_API_TOKEN: when set, every route but /healthz (and the dashboard's static files)
needs `Authorization: Bearer <token>`."""

from __future__ import annotations

import secrets

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from qforge.api.errors import ApiError

bearer = HTTPBearer(auto_error=False, description="QFORGE_API_TOKEN, when the server sets one")

# EventSource cannot set headers, so the stream also takes ?token=.
QUERY_TOKEN_PATHS = frozenset({"/events/stream"})


def require_token(request: Request,
                  credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
    expected = request.app.state.resources.settings.api_token
    if not expected:
        return
    supplied = credentials.credentials if credentials is not None else None
    if supplied is None and request.url.path in QUERY_TOKEN_PATHS:
        supplied = request.query_params.get("token")
    if not supplied or not secrets.compare_digest(supplied.encode(), expected.encode()):
        raise ApiError(401, "unauthorized",
                       "this API needs 'Authorization: Bearer <token>' (QFORGE_API_TOKEN)"
                       if supplied is None else "the token is not valid",
                       headers={"WWW-Authenticate": "Bearer"})
