"""Choosing the database: which URL a process uses, the roles' logins and their passwords.

Without a URL setting this starts (or attaches to) the embedded server of
``qforge.db.embedded`` and makes it ask every role for its password.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from pathlib import Path
from typing import Mapping

import psycopg
from psycopg import sql

from qforge.db.connections import CONNECT_TIMEOUT_SECONDS, url_login, with_credentials
from qforge.db.embedded import _SHARED, _THREAD_LOCK, EmbeddedPostgres
from qforge.settings import Settings, get_settings

_log = logging.getLogger("qforge.db")



# The processes' roles (issue 30, migrations/definitions/90_roles.sql): kind -> the
# setting that names its URL.
ROLE_KINDS = ("api", "worker", "monitor", "read")
ROLE_URL_SETTINGS = {"api": "api_database_url", "worker": "worker_database_url",
                     "monitor": "monitor_database_url", "read": "readonly_database_url"}
CREDENTIALS_FILE = "credentials.json"
_HBA_MARK = "# qforge: passwords only (scram-sha-256), no trust"
_fallback_said: set[str] = set()


def role_name(prefix: str, kind: str) -> str:
    """The login role of a kind of process (role_name() in 90_roles.sql)."""
    return f"{prefix}_{kind}"


def resolve_database_url(explicit: str | None = None, settings: Settings | None = None,
                         role: str | None = None) -> str:
    """The URL to use: ``explicit``, else the setting of `role`'s own URL (QFORGE_WORKER_DATABASE_URL
    ...), else ``QFORGE_DATABASE_URL``, else the embedded server (as `role`'s login with its
    generated password, or as the schema owner when `role` is None).

    The embedded server keeps its data in ``<data_dir>/pgdata`` and is started
    (or attached to, when another process runs it) on first use. It stays up
    while this process lives; the last process using it stops it at exit.
    """
    if explicit:
        return explicit
    settings = settings or get_settings()
    if role is not None:
        own = getattr(settings, ROLE_URL_SETTINGS[role])
        if own:
            return own
    if settings.database_url:
        if role is not None and role not in _fallback_said:
            _fallback_said.add(role)
            _log.warning("QFORGE_%s is not set: this process uses QFORGE_DATABASE_URL's credentials, the"
                         " schema owner's (docs/security.md)", ROLE_URL_SETTINGS[role].upper())
        return settings.database_url
    data_dir = Path(settings.data_dir).expanduser().absolute()
    pgdata = (data_dir / "pgdata").resolve()
    with _THREAD_LOCK:
        server = _SHARED.get(pgdata)
        if server is None or server.url is None:
            server = EmbeddedPostgres()
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            server.start(pgdata, cleanup_mode="stop")
            # Registered after the wheel's own exit hook, so it runs first
            # (atexit is last in, first out) and prunes dead users before the
            # wheel decides whether this process is the last one.
            atexit.unregister(stop_embedded)
            atexit.register(stop_embedded)
            _SHARED[pgdata] = server
        assert server.url is not None
        credentials = embedded_credentials(data_dir, pgdata, server.url)
    if role is None:
        return with_credentials(server.url, EMBEDDED_SUPERUSER, credentials["owner"])
    return with_credentials(server.url, role_name(settings.role_prefix, role), credentials[role])


EMBEDDED_SUPERUSER = "postgres"  # the wheel's initdb -U


def embedded_credentials(data_dir: Path, pgdata: Path, url: str) -> dict[str, str]:
    """The passwords of the embedded server's schema owner and of each role, made once and kept
    in <data_dir>/credentials.json (0600); and the server made to ask for them: the wheel's
    initdb trusts every local connection, so the first process to get here gives the
    superuser its password, rewrites pg_hba.conf to scram-sha-256 for everyone and reloads.
    Safe from several processes at once (a file lock). The roles get their passwords from
    `qforge migrate` (set_role_passwords), once it has made them."""
    import fcntl
    import secrets as secret_source

    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "credentials.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = data_dir / CREDENTIALS_FILE
        try:
            credentials = json.loads(path.read_text())
        except FileNotFoundError:
            credentials = {kind: secret_source.token_urlsafe(24) for kind in ("owner", *ROLE_KINDS)}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(credentials, out, indent=1)
        os.chmod(path, 0o600)
        hba = pgdata / "pg_hba.conf"
        if _HBA_MARK not in hba.read_text():
            with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(EMBEDDED_SUPERUSER), sql.Literal(credentials["owner"])))
                owner = hba.stat()
                hba.write_text(f"{_HBA_MARK}\n# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
                               "local   all       all            scram-sha-256\n")
                os.chown(hba, owner.st_uid, owner.st_gid)
                os.chmod(hba, 0o600)
                conn.execute("SELECT pg_reload_conf()")
        return credentials


def set_role_passwords(owner_url: str, logins: Mapping[str, str]) -> list[str]:
    """Give each role of `logins` (role name -> password) that password, unless it logs in with
    it already (so two processes at once do not both ALTER ROLE); returns the roles changed."""
    changed = []
    with psycopg.connect(owner_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
        for user, password in logins.items():
            try:
                psycopg.connect(with_credentials(owner_url, user, password),
                                connect_timeout=CONNECT_TIMEOUT_SECONDS).close()
                continue
            except psycopg.OperationalError:
                pass
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(user), sql.Literal(password)))
            changed.append(user)
    return changed


def role_logins(settings: Settings, owner_url: str) -> dict[str, str]:
    """The roles' passwords that `qforge migrate` should set: with the embedded server, those of
    credentials.json; with an external one, those in each role's URL setting whose user is
    the role's name."""
    logins: dict[str, str] = {}
    if not settings.database_url and not any(getattr(settings, name) for name in ROLE_URL_SETTINGS.values()):
        data_dir = Path(settings.data_dir).expanduser().absolute()
        path = data_dir / CREDENTIALS_FILE
        if path.exists():
            credentials = json.loads(path.read_text())
            return {role_name(settings.role_prefix, kind): credentials[kind] for kind in ROLE_KINDS}
        return logins
    for kind, setting in ROLE_URL_SETTINGS.items():
        url = getattr(settings, setting)
        if url:
            user, password = url_login(url)
            if user == role_name(settings.role_prefix, kind) and password:
                logins[user] = password
    return logins


def stop_embedded() -> None:
    """Let go of the servers resolve_database_url() started; each stops if no other process uses it."""
    with _THREAD_LOCK:
        for server in list(_SHARED.values()):
            server.stop()
        _SHARED.clear()
