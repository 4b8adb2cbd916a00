"""Least privilege in the database (issue 30): each process's role may do its own commands and
nothing of the rest: no token events, no token digests, no ticket key, no roles (42501 each)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from qforge.commands import tokens
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.errors import NotAllowed
from qforge.db import CREDENTIALS_FILE, connect, with_credentials
from qforge.events.types import EVENT_DATA
from cluster_procs import start_api
from test_worker_support import QFORGE, Processes, procs, role_url, tasks_dir, wait_for  # noqa: F401

PROCESS_KINDS = ("api", "worker", "monitor")

# What no process's credentials may do, each refused with SQLSTATE 42501.
FORBIDDEN = {
    "append a TokenCreated event": """
        INSERT INTO events (stream_type, stream_id, version, type, data, actor, hash)
        VALUES ('token', gen_random_uuid(), 1, 'TokenCreated',
                '{"name": "mine", "scope": "admin", "sha256": "%s"}', 'evil', '\\x00'::bytea)""" % ("0" * 64),
    "read the token table": "SELECT * FROM token_secrets",
    "read the ticket key": "SELECT key FROM server_keys",
    "create a role": "CREATE ROLE qforge_evil LOGIN SUPERUSER",
    "rewrite the log": "UPDATE events SET actor = 'evil'",
    "delete from the log": "DELETE FROM events",
    "let a token in": "UPDATE tokens SET status = 'active'",
}


def refused(url: str, statement: str) -> psycopg.Error:
    with connect(url, autocommit=True) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute(statement)
    return caught.value


@pytest.mark.parametrize("kind", PROCESS_KINDS + ("read",))
def test_no_process_role_can_make_tokens_read_secrets_or_create_roles(db_url: str, conn, kind: str) -> None:
    tokens.create_token(conn, "root", "admin", actor="test")  # tokens are on: no "first token" pass
    url = role_url(db_url, kind)
    for what, statement in FORBIDDEN.items():
        error = refused(url, statement)
        assert error.sqlstate == "42501", (kind, what, error)
    with connect(url, autocommit=True) as role_conn:
        with pytest.raises((psycopg.errors.InsufficientPrivilege, NotAllowed)):  # NotAllowed: the 42501
            tokens.create_token(role_conn, "mine", "admin", actor="evil")       # of token_write()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            # even with an old digest from the log: the function wants the secret itself
            role_conn.execute("SELECT token_write(%s, gen_random_uuid(), 1, 'TokenCreated',"
                              " '{\"name\": \"x\", \"scope\": \"admin\"}', 'evil', %s)",
                              ("0" * 64, "0" * 64))
    assert [row["name"] for row in tokens.list_tokens(conn, include_revoked=True)] == ["root"]


@pytest.mark.parametrize("kind, foreign", [("worker", "ScheduleCreated"), ("worker", "QueuePaused"),
                                           ("monitor", "Claimed"), ("monitor", "DefinitionStored"),
                                           ("api", "Claimed"), ("api", "Heartbeat"), ("read", "Enqueued")])
def test_a_role_appends_only_the_event_types_of_its_own_commands(db_url: str, kind: str, foreign: str) -> None:
    error = refused(role_url(db_url, kind), f"""
        INSERT INTO events (stream_type, stream_id, version, type, data, actor, hash)
        VALUES ('job', gen_random_uuid(), 1, '{foreign}', '{{}}', 'evil', '\\x00'::bytea)""")
    assert error.sqlstate == "42501", error


def test_the_table_of_who_may_do_what_covers_every_event_type_and_definer(conn) -> None:
    """definitions/90_roles.sql is the one place: a new event type or SECURITY DEFINER function
    that is not in it fails here."""
    listed = {row["type"] for row in conn.execute("SELECT DISTINCT type FROM role_event_types").fetchall()}
    assert listed - set(EVENT_DATA) == set(), "role_event_types names types that do not exist"
    assert set(EVENT_DATA) - listed == set(), "event types no role (nor the owner) is listed for"
    assert conn.execute("SELECT type FROM role_event_types WHERE kind <> 'owner' AND type LIKE 'Token%'"
                        ).fetchall() == []
    definers = conn.execute("""
        SELECT p.oid::regprocedure::text AS function, p.proconfig, has_function_privilege('public', p.oid,
               'EXECUTE') AS public_may
          FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef""").fetchall()
    listed_functions = {row["function"] for row in conn.execute(
        "SELECT function::regprocedure::text AS function FROM role_functions").fetchall()}
    assert {row["function"] for row in definers} == listed_functions
    for row in definers:
        assert not row["public_may"], row
        assert any(setting.startswith("search_path=") for setting in row["proconfig"]), row
    roles = conn.execute("""
        SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolcanlogin FROM pg_roles
         WHERE rolname IN ('qforge_api', 'qforge_worker', 'qforge_monitor', 'qforge_read')""").fetchall()
    assert len(roles) == 4 and all(r["rolcanlogin"] and not (r["rolsuper"] or r["rolcreaterole"] or r["rolcreatedb"]
                                                             or r["rolbypassrls"]) for r in roles), roles


def test_stream_tickets_are_signed_in_the_database_with_the_key_no_role_reads(db_url: str, conn) -> None:
    key = bytes(conn.execute("SELECT key FROM server_keys WHERE name = 'stream_ticket'").fetchone()["key"])
    with connect(role_url(db_url, "api"), autocommit=True) as api:
        for payload in (b"", b"x", b'{"t":"root","p":"stream","exp":1}' * 9):
            assert tokens.stream_ticket_mac(api, payload) == hmac.new(key, payload, hashlib.sha256).digest()


def test_migrate_twice_and_from_two_processes_at_once_keeps_the_roles(db_url: str, conn, tmp_path: Path) -> None:
    runs = [subprocess.Popen([str(QFORGE), "migrate", "--database-url", db_url], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for _ in range(2)]
    for run in runs:
        output = run.communicate(timeout=120)[0].decode()
        assert run.returncode == 0, output
    assert refused(role_url(db_url, "worker"), FORBIDDEN["read the token table"]).sqlstate == "42501"
    with connect(role_url(db_url, "worker"), autocommit=True) as worker:
        enqueue(worker, [JobSpec(task="echo")], actor="w")


# --------------------------------------------------------------------------- real processes


@pytest.fixture
def api_procs(procs: Processes) -> Iterator[tuple[Processes, str]]:
    _, base = start_api(procs, env={"QFORGE_API_TOKEN": ""})
    yield procs, base


def test_processes_run_on_their_roles_and_the_api_reads_as_the_read_only_one(conn, api_procs) -> None:
    procs, base = api_procs
    procs.worker("--concurrency", "2")
    procs.monitor()
    with httpx.Client(base_url=base, timeout=30) as http:
        root = http.post("/tokens", json={"name": "root", "scope": "admin"})  # the first: anyone, loopback
        assert root.status_code == 201, root.text
        admin = {"Authorization": f"Bearer {root.json()['token']}"}
        job = http.post("/jobs", json={"task": "echo", "payload": {"x": 1}}, headers=admin).json()
        wait_for(lambda: http.get(f"/jobs/{job['id']}", headers=admin).json()["status"] == "succeeded",
                 timeout=30, message="the job to succeed")
        # a second token needs an admin token, checked by the database itself
        reader = http.post("/tokens", json={"name": "reader", "scope": "read"}, headers=admin)
        assert reader.status_code == 201, reader.text
        # the log serves no digest, and the stream's tickets are made by the database
        token_events = [e for e in http.get("/events", params={"after": "0", "limit": 1000},
                                            headers=admin).json()["events"] if e["stream_type"] == "token"]
        assert [e["data"] for e in token_events] == [{"name": "root", "scope": "admin"},
                                                     {"name": "reader", "scope": "read"}]
        ticket = http.post("/events/stream-ticket", headers=admin).json()["ticket"]
        with http.stream("GET", "/events/stream", params={"ticket": ticket, "after": "0"}) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    break
        revoked = http.delete("/tokens/reader", headers=admin)
        assert revoked.status_code == 204, revoked.text

    def users() -> set[str]:
        rows = conn.execute("SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = current_database()"
                            " AND pid <> pg_backend_pid()").fetchall()
        return {row["usename"] for row in rows}

    wait_for(lambda: {"qforge_api", "qforge_read", "qforge_worker", "qforge_monitor"} <= users(), timeout=20,
             message="every process connected on its role")
    assert users() <= {"qforge_api", "qforge_read", "qforge_worker", "qforge_monitor"}, users()


def test_an_old_digest_in_the_log_is_never_served(conn, api_procs) -> None:
    """Events written before 0021 carried the secret's digest: the log keeps their bytes (hash
    chain), the API never shows the field."""
    _, base = api_procs
    conn.execute("""
        INSERT INTO events (stream_type, stream_id, version, type, data, occurred_at, actor, hash)
        SELECT 'token', id, 1, 'TokenCreated', d, now(), 'cli:old',
               event_hash(NULL, 'token', id, 1, 'TokenCreated', 1::smallint, d, NULL, NULL, now(), 'cli:old')
          FROM (SELECT gen_random_uuid() AS id,
                       jsonb_build_object('name', 'old', 'scope', 'read', 'sha256', repeat('ab', 32)) AS d) x""")
    secret = tokens.create_token(conn, "root", "admin", actor="test")
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {secret}"}) as http:
        body = http.get("/events", params={"after": "0", "limit": 1000}).text
    assert "abab" not in body and '"name":"old"' in body.replace(" ", "")


# --------------------------------------------------------------------------- the embedded server


def test_the_embedded_server_wants_passwords_and_each_role_logs_in_with_its_own(scratch_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QFORGE_")}
    env["QFORGE_DATA_DIR"] = str(scratch_dir / ".qforge")
    migrated = subprocess.run([str(QFORGE), "migrate"], env=env, capture_output=True, text=True, timeout=180)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    credentials_path = scratch_dir / ".qforge" / CREDENTIALS_FILE
    assert stat.S_IMODE(credentials_path.stat().st_mode) == 0o600
    credentials = json.loads(credentials_path.read_text())
    socket_dir = scratch_dir / ".qforge" / "pgdata"
    started = subprocess.Popen([str(QFORGE), "worker", "--concurrency", "1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # once the worker works (on its own role), the server is up for good
        def worker_connected() -> bool:
            conn = _try_connect(socket_dir, credentials["owner"])
            if conn is None:
                return False
            with conn:
                return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'qforge_worker'"
                                    ).fetchone()[0] > 0

        try:
            wait_for(worker_connected, timeout=60, message="the worker connected on its own role")
        except BaseException:
            started.terminate()
            print(started.communicate(timeout=30)[0].decode())
            raise
        base = f"postgresql://postgres@/postgres?host={_socket_dir(socket_dir)}"
        with pytest.raises(psycopg.OperationalError) as no_password:
            psycopg.connect(base, connect_timeout=5).close()
        assert "password" in str(no_password.value)
        with pytest.raises(psycopg.OperationalError) as wrong:
            psycopg.connect(with_credentials(base, "qforge_worker", "wrong"), connect_timeout=5).close()
        assert "password authentication failed" in str(wrong.value)
        worker = with_credentials(base, "qforge_worker", credentials["worker"])
        assert refused(worker, FORBIDDEN["append a TokenCreated event"]).sqlstate == "42501"
        assert refused(worker, FORBIDDEN["create a role"]).sqlstate == "42501"
    finally:
        started.terminate()
        started.communicate(timeout=30)


def _try_connect(pgdata: Path, password: str) -> psycopg.Connection | None:
    try:
        return psycopg.connect(with_credentials(f"postgresql://postgres@/postgres?host={_socket_dir(pgdata)}",
                                                "postgres", password), connect_timeout=5)
    except (OSError, IndexError, psycopg.OperationalError):
        return None


def _socket_dir(pgdata: Path) -> str:
    """The embedded server's socket folder (postmaster.pid, line 5)."""
    return (pgdata / "postmaster.pid").read_text().splitlines()[4].strip()
