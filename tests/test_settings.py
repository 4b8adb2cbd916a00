"""Settings: QFORGE_* variables, a .env file in the working directory, the environment winning over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from qforge.settings import get_settings


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
