"""API tokens: create (the secret is returned once, only its SHA-256 is kept), revoke, list, authenticate."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

from qforge.commands.errors import Conflict, Invalid, NotAllowed, NotFound
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.states import allows
from qforge.sql import q

# Each scope includes the ones before it.
SCOPES = ("read", "operate", "admin")
# Lower case, digits, '.', '_', '-': names show up as the actor of events and in
# URLs. Names the server gives itself (api-token, anonymous, cli:<user>,
# worker and monitor names with ':') cannot be taken.
NAME_RULE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
RESERVED_NAMES = frozenset({"api-token", "anonymous", "api", "system"})
SECRET_PREFIX = "qf_"


@dataclass(frozen=True)
class Who:
    """Who asked: a token's name and scope (or the server's own stand-ins)."""

    name: str
    scope: str

    def may(self, needed: str) -> bool:
        return SCOPES.index(self.scope) >= SCOPES.index(needed)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_name(name: str) -> None:
    if not NAME_RULE.match(name) or name in RESERVED_NAMES:
        raise Invalid(f"token name {name!r} is not allowed: 1-63 characters of a-z, 0-9, '.', '_', '-',"
                      f" starting with a letter or digit, and not one of {sorted(RESERVED_NAMES)}",
                      [{"field": "name", "value": name}])


def check_scope(scope: str) -> None:
    if scope not in SCOPES:
        raise Invalid(f"scope {scope!r} is not one of {', '.join(SCOPES)}",
                      [{"field": "scope", "value": scope}])


def _append(cur, stream_id, version: int, data: ev.EventData, actor: str, caller_secret: str | None,
            sha256: str | None = None) -> None:
    try:
        cur.execute(q("token_write"), {"id": stream_id, "version": version, "type": data.type,
                                       "data": json.dumps(data.model_dump(mode="json")), "actor": actor,
                                       "caller_secret": caller_secret, "sha256": sha256})
    except psycopg.errors.InsufficientPrivilege:
        raise NotAllowed("creating or revoking tokens needs a named admin token (or `qforge token`"
                         " with the schema owner's database URL)") from None


def create_token(conn, name: str, scope: str, *, actor: str, caller_secret: str | None = None) -> str:
    """A new token named `name` (again, if that name was revoked); returns the secret, which
    is shown this once and stored nowhere. The database checks that `caller_secret` is an
    active admin token's (not needed on the schema owner's connection, nor before any token
    exists)."""
    check_name(name)
    check_scope(scope)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    data = ev.TokenCreated(name=name, scope=scope)  # type: ignore[arg-type]
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("token_lock"), {"name": name})
            row = cur.fetchone()
            if row is not None and not allows("token", row["status"], data.type):
                raise Conflict(f"token {name!r} exists: revoke it first to make a new one of that name")
            if row is None:
                _append(cur, new_id(), 1, data, actor, caller_secret, digest(secret))
            else:
                _append(cur, row["id"], row["version"] + 1, data, actor, caller_secret, digest(secret))
    except psycopg.errors.UniqueViolation:
        # Two creations of one new name at once: the other one won.
        raise Conflict(f"token {name!r} exists: revoke it first to make a new one of that name") from None
    return secret


def revoke_token(conn, name: str, *, actor: str, caller_secret: str | None = None) -> None:
    """Revoke a token: every API process refuses it from the next request on."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("token_lock"), {"name": name})
        row = cur.fetchone()
        if row is None:
            raise NotFound(f"token {name!r} not found")
        if not allows("token", row["status"], ev.TokenRevoked.type):
            raise Conflict(f"token {name!r} is already revoked")
        _append(cur, row["id"], row["version"] + 1, ev.TokenRevoked(name=name), actor, caller_secret)


def list_tokens(conn, *, include_revoked: bool = False) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("token_list"), {"all": include_revoked})
        return cur.fetchall()


def authenticate(conn, secret: str | None) -> tuple[bool, Who | None]:
    """(are tokens on, the active token with this secret or None)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("token_authenticate"), {"sha256": digest(secret) if secret else ""})
        row = cur.fetchone()
    who = Who(row["name"], row["scope"]) if row["name"] is not None else None
    return row["enabled"], who


def is_active(conn, name: str) -> bool:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("token_active"), {"name": name})
        return cur.fetchone()["active"]


def tokens_exist(conn) -> bool:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("tokens_exist"))
        return cur.fetchone()["enabled"]


def stream_ticket_mac(conn, payload: bytes) -> bytes:
    """HMAC-SHA256 of `payload` with the stream-ticket key, computed in the database (no
    process's role reads the key)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("stream_ticket_mac"), {"payload": payload})
        return bytes(cur.fetchone()["mac"])


def server_key(conn, name: str) -> bytes:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("server_key"), {"name": name})
        row = cur.fetchone()
    if row is None:
        raise RuntimeError(f"server key {name!r} is missing: run `qforge migrate`")
    return bytes(row["key"])
