"""Settings: QFORGE_* variables, a .env file in the working directory, the environment winning over it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from qforge.settings import Settings, get_settings
from test_worker_support import QFORGE


@pytest.fixture
def in_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("QFORGE_HEARTBEAT_SECONDS", "QFORGE_API_TOKEN", "QFORGE_PORT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_dotenv_file_is_read(in_folder: Path):
    (in_folder / ".env").write_text("QFORGE_HEARTBEAT_SECONDS=7\nQFORGE_API_TOKEN=from-file\nOTHER_TOOL=1\n")
    settings = get_settings()
    assert settings.heartbeat_seconds == 7
    assert settings.api_token == "from-file"


def test_environment_wins_over_dotenv(in_folder: Path, monkeypatch: pytest.MonkeyPatch):
    (in_folder / ".env").write_text("QFORGE_PORT=9000\n")
    monkeypatch.setenv("QFORGE_PORT", "9100")
    assert get_settings().port == 9100


def test_without_dotenv_defaults_hold(in_folder: Path):
    assert get_settings().heartbeat_seconds == 2 and get_settings().port == 8090


# --- QFORGE_POOLER (docs/operations/pgbouncer.md; PgBouncer itself: tests/test_pgbouncer.py) --------


def _qforge(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QFORGE_")}
    return subprocess.run([str(QFORGE), *args], capture_output=True, text=True, timeout=120, cwd=folder,
                          env={**clean, **env})


def test_an_unknown_pooler_mode_is_refused_naming_the_one_there_is(tmp_path: Path) -> None:
    done = _qforge(tmp_path, "worker", "--database-url", "postgresql://nowhere.invalid/x", QFORGE_POOLER="statement")
    assert done.returncode == 2
    assert "QFORGE_POOLER='statement' is not a pooling mode" in done.stderr and "'transaction'" in done.stderr


def test_migrate_behind_the_pooler_runs_on_the_direct_url_or_refuses_without_one(tmp_path: Path,
                                                                               empty_db_url: str) -> None:
    pooled = "postgresql://qforge@127.0.0.1:1/nowhere"  # nothing listens there: it must not be used
    refused = _qforge(tmp_path, "migrate", "--database-url", pooled, QFORGE_POOLER="transaction")
    assert refused.returncode == 1 and "set QFORGE_LISTEN_DATABASE_URL" in refused.stderr, refused.stderr
    done = _qforge(tmp_path, "migrate", "--database-url", pooled, QFORGE_POOLER="transaction",
                   QFORGE_LISTEN_DATABASE_URL=empty_db_url)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_the_direct_url_logs_in_as_the_process_unless_it_names_a_user() -> None:
    from qforge.db import direct_url, pooler_kwargs
    from qforge.settings import Settings

    own = "postgresql://qforge_worker:pw@bouncer:6432/qforge"
    assert direct_url(own, Settings()) == own and pooler_kwargs(Settings()) == {}  # no pooler: nothing changes
    pooled = Settings(pooler="transaction")
    assert direct_url(own, pooled) is None and pooler_kwargs(pooled) == {"prepare_threshold": None}
    listen = Settings(pooler="transaction", listen_database_url="postgresql://db:5432/qforge")
    assert direct_url(own, listen) == "postgresql://qforge_worker:pw@db:5432/qforge"
    named = Settings(pooler="transaction", listen_database_url="postgresql://listener:x@db:5432/qforge")
    assert direct_url(own, named) == "postgresql://listener:x@db:5432/qforge"


def test_role_logins_take_each_roles_password_from_its_url_setting() -> None:
    """`qforge migrate` on an external server sets the passwords the role URL settings carry
    (only for a URL whose user is that role's name)."""
    from qforge.db import role_logins, role_name

    settings = Settings(database_url="postgresql://owner:pw@db.invalid/qforge",
                        worker_database_url=f"postgresql://{role_name(Settings().role_prefix, 'worker')}:s3cret@db.invalid/qforge",
                        api_database_url="postgresql://someone_else:nope@db.invalid/qforge")
    logins = role_logins(settings, settings.database_url)
    assert logins == {role_name(settings.role_prefix, "worker"): "s3cret"}
