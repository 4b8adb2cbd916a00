"""Runtime settings, read from ``QFORGE_*`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob QForge reads from the environment (``QFORGE_<NAME>``)."""

    model_config = SettingsConfigDict(env_prefix="QFORGE_", extra="ignore")

    # External PostgreSQL; None means the embedded server under data_dir/pgdata.
    database_url: str | None = None
    data_dir: str = "./.qforge"

    heartbeat_seconds: float = Field(default=2, gt=0)
    stale_seconds: float = Field(default=10, gt=0)
    backoff_base_seconds: float = Field(default=1, ge=0)
    backoff_cap_seconds: float = Field(default=300, ge=0)
    monitor_tick_seconds: float = Field(default=1, gt=0)
    poll_interval_seconds: float = Field(default=1, gt=0)
    # How long a stopping worker lets running jobs finish before handing them back.
    shutdown_grace_seconds: float = Field(default=10, ge=0)
    # Python logging level of the long-running processes (worker, monitor).
    log_level: str = "INFO"

    # When set, the API requires "Authorization: Bearer <token>" (except /healthz).
    api_token: str | None = None
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    # The longest list a for_each step fans out over (longer ones fail the step).
    max_fan_out: int = Field(default=10_000, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)


def get_settings() -> Settings:
    """Read the settings afresh (cheap), so tests can change the environment between calls."""
    return Settings()
