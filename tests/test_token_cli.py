"""qforge token create | list | revoke: the secret printed once, the lifecycle in the log, replay agrees."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from qforge.commands import tokens
from qforge.commands.errors import Conflict
from qforge.projections.replay import verify

ROOT = Path(__file__).resolve().parent.parent


def qforge(db_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "USER": "alice"}
    env.pop("QFORGE_API_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "qforge.cli", "--database-url", db_url, "token", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_create_prints_the_secret_once_and_stores_only_its_hash(db_url: str, conn: psycopg.Connection) -> None:
    created = qforge(db_url, "create", "ci", "--scope", "operate")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("qf_") and len(secret) > 30
    row = conn.execute("SELECT t.name, t.scope, t.status, s.sha256, t.created_by FROM tokens t"
                       " JOIN token_secrets s ON s.id = t.id").fetchone()
    assert row == {"name": "ci", "scope": "operate", "status": "active",
                   "sha256": hashlib.sha256(secret.encode()).hexdigest(), "created_by": "cli:alice"}
    logged = conn.execute("SELECT data::text AS data, actor FROM events WHERE stream_type = 'token'").fetchall()
    # neither the secret nor its digest is in the log (issue 30)
    assert len(logged) == 1 and secret not in logged[0]["data"] and row["sha256"] not in logged[0]["data"]
    assert logged[0]["actor"] == "cli:alice"
    assert tokens.authenticate(conn, secret) == (True, tokens.Who("ci", "operate"))


def test_list_and_revoke(db_url: str, conn: psycopg.Connection) -> None:
    assert qforge(db_url, "create", "reader", "--scope", "read").returncode == 0
    assert qforge(db_url, "create", "boss", "--scope", "admin").returncode == 0
    assert qforge(db_url, "revoke", "reader").returncode == 0
    listed = qforge(db_url, "list")
    assert "boss" in listed.stdout and "reader" not in listed.stdout
    everything = qforge(db_url, "list", "--all")
    assert "reader" in everything.stdout and "revoked" in everything.stdout
    again = qforge(db_url, "revoke", "reader")
    assert again.returncode == 1 and "already revoked" in again.stderr
    missing = qforge(db_url, "revoke", "nobody")
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_bad_names_and_scopes_are_refused_and_store_nothing(db_url: str, conn: psycopg.Connection) -> None:
    for args in (["create", "Bad Name", "--scope", "read"], ["create", "api-token", "--scope", "read"],
                 ["create", "cli:bob", "--scope", "read"]):
        result = qforge(db_url, *args)
        assert result.returncode != 0 and "not allowed" in result.stderr, args
    assert qforge(db_url, "create", "x", "--scope", "root").returncode != 0
    assert conn.execute("SELECT count(*) AS n FROM events WHERE stream_type = 'token'").fetchone()["n"] == 0


def test_a_revoked_name_can_be_created_again_with_a_new_secret(db_url: str, conn: psycopg.Connection) -> None:
    first = tokens.create_token(conn, "ci", "read", actor="test")
    tokens.revoke_token(conn, "ci", actor="test")
    second = tokens.create_token(conn, "ci", "admin", actor="test")
    assert first != second
    assert tokens.authenticate(conn, first) == (True, None)
    assert tokens.authenticate(conn, second) == (True, tokens.Who("ci", "admin"))


def test_the_token_log_chains_and_replay_rebuilds_tokens(db_url: str, conn: psycopg.Connection) -> None:
    tokens.create_token(conn, "a", "read", actor="test")
    tokens.create_token(conn, "b", "operate", actor="test")
    tokens.revoke_token(conn, "a", actor="test")
    tokens.create_token(conn, "a", "admin", actor="test")
    rows = conn.execute(
        "SELECT stream_id, version, hash, event_hash(lag(hash) OVER w, stream_type, stream_id, version, type,"
        "       schema_version, data, tags, workflow_id, occurred_at, actor) AS recomputed"
        "  FROM events WHERE stream_type = 'token' WINDOW w AS (PARTITION BY stream_id ORDER BY version)").fetchall()
    assert len(rows) == 4 and all(bytes(r["hash"]) == bytes(r["recomputed"]) for r in rows)
    heads = conn.execute("SELECT t.chain, e.hash FROM tokens t JOIN events e ON e.stream_id = t.id"
                         " AND e.version = t.version").fetchall()
    assert len(heads) == 2 and all(bytes(h["chain"]) == bytes(h["hash"]) for h in heads)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as fresh:
        assert verify(fresh) == []
    conn.execute("UPDATE tokens SET scope = 'admin' WHERE name = 'b'")  # tamper with the projection
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as fresh:
        assert [d.table for d in verify(fresh)] == ["tokens"]


def test_the_api_refuses_a_public_address_while_no_token_exists(db_url: str, conn: psycopg.Connection) -> None:
    env = {**os.environ}
    env.pop("QFORGE_API_TOKEN", None)
    refused = subprocess.run([sys.executable, "-m", "qforge.cli", "--database-url", db_url, "api",
                              "--host", "0.0.0.0", "--port", "1"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "refusing to listen on 0.0.0.0" in refused.stderr
    from qforge.cli.api import is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1")


def race(db_url: str, command) -> list[str]:
    """Run `command(conn)` in two threads at once (each its own connection): what each got."""
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def run() -> None:
        with psycopg.connect(db_url, autocommit=True) as own:
            barrier.wait()
            try:
                command(own)
                outcomes.append("done")
            except Conflict:
                outcomes.append("conflict")

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes)


def test_two_revocations_at_once_write_one_event(db_url: str, conn: psycopg.Connection) -> None:
    tokens.create_token(conn, "ci", "read", actor="test")
    assert race(db_url, lambda own: tokens.revoke_token(own, "ci", actor="test")) == ["conflict", "done"]
    assert conn.execute("SELECT count(*) AS n FROM events WHERE type = 'TokenRevoked'").fetchone()["n"] == 1


def test_two_creations_of_one_new_name_at_once_make_one_token(db_url: str, conn: psycopg.Connection) -> None:
    assert race(db_url, lambda own: tokens.create_token(own, "ci", "read", actor="test")) == ["conflict", "done"]
    assert conn.execute("SELECT count(*) AS n FROM tokens").fetchone()["n"] == 1
