"""/tokens: API tokens over HTTP, for admins (the same commands as `qforge token`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from qforge.api.auth import Actor, needs
from qforge.api.common import ERRORS
from qforge.api.deps import Conn
from qforge.commands.tokens import create_token, list_tokens, revoke_token

router = APIRouter(tags=["tokens"])


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=63, description="the actor of every event written with the token")
    scope: Literal["read", "operate", "admin"]


class TokenCreatedView(BaseModel):
    name: str
    scope: str
    token: str = Field(description="the secret: shown this once, only its SHA-256 is kept")


class TokenView(BaseModel):
    name: str
    scope: str
    status: str
    created_by: str
    created_at: str
    revoked_at: str | None = None
    revoked_by: str | None = None


class TokenList(BaseModel):
    items: list[TokenView]
    next: None = None


@router.get("/tokens", response_model=TokenList, responses=ERRORS, **needs("admin"))
def tokens(conn: Conn, all: Annotated[bool, Query(description="revoked tokens too")] = False) -> dict:
    """Tokens (never their secrets), by name."""
    rows = list_tokens(conn, include_revoked=all)
    for row in rows:
        row["created_at"] = row["created_at"].isoformat()
        row["revoked_at"] = row["revoked_at"].isoformat() if row["revoked_at"] else None
    return {"items": rows, "next": None}


@router.post("/tokens", status_code=201, response_model=TokenCreatedView, responses=ERRORS,
             **needs("admin"))
def create(body: TokenCreate, conn: Conn, actor: Actor, request: Request) -> dict:
    """Make a token (409 if the name is active: revoke it first; 403 with QFORGE_API_TOKEN
    once named tokens exist: the database checks a named admin token)."""
    secret = create_token(conn, body.name, body.scope, actor=actor,
                          caller_secret=getattr(request.state, "secret", None))
    return {"name": body.name, "scope": body.scope, "token": secret}


@router.delete("/tokens/{name}", status_code=204, response_class=Response, responses=ERRORS,
               **needs("admin"))
def revoke(name: Annotated[str, Path(max_length=63)], conn: Conn, actor: Actor, request: Request) -> Response:
    """Revoke a token: refused at once by every API process, open streams end within seconds."""
    revoke_token(conn, name, actor=actor, caller_secret=getattr(request.state, "secret", None))
    return Response(status_code=204)
