"""Runtime settings, read from ``QFORGE_*`` environment variables and a ``.env`` file (the environment wins)."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob QForge reads from the environment (``QFORGE_<NAME>``)."""

    # .env in the working directory, as twelve-factor tools read it; a variable set in the
    # environment overrides the file (pydantic-settings' order), and keys without the
    # QFORGE_ prefix are other programs' business.
    model_config = SettingsConfigDict(env_prefix="QFORGE_", extra="ignore",
                                      env_file=".env", env_file_encoding="utf-8")

    # External PostgreSQL; None means the embedded server under data_dir/pgdata. The
    # schema owner's URL: `qforge migrate` and the operator's commands (token, archive,
    # replay, audit) use it.
    database_url: str | None = None
    # Each process's own role (issue 30, docs/security.md): the API's writes, the
    # workers, the monitor, and the read-only role of the API's reads. Unset with an
    # external server: that process falls back to database_url (and says so); with the
    # embedded server each process logs in as <role_prefix>_<kind> with the password
    # generated in data_dir/credentials.json.
    api_database_url: str | None = None
    worker_database_url: str | None = None
    monitor_database_url: str | None = None
    readonly_database_url: str | None = None
    # The roles' names: <role_prefix>_api, _worker, _monitor, _read. Two installations
    # on one server that must not reach each other's data take different prefixes.
    role_prefix: str = Field(default="qforge", pattern=r"^[a-z][a-z0-9_]{0,40}$")
    data_dir: str = "./.qforge"
    # A hot standby for the API's reads (lists, histories, search, /events, the stream, the
    # dashboard); None: everything reads from the primary.
    read_database_url: str | None = None
    # How long a read waits for the standby to replay a write the client has seen before it
    # reads from the primary instead.
    read_wait_seconds: float = Field(default=1, ge=0)

    heartbeat_seconds: float = Field(default=2, gt=0)
    stale_seconds: float = Field(default=10, gt=0)
    backoff_base_seconds: float = Field(default=1, ge=0)
    backoff_cap_seconds: float = Field(default=300, ge=0)
    monitor_tick_seconds: float = Field(default=1, gt=0)
    poll_interval_seconds: float = Field(default=1, gt=0)
    # A schedule's tick later than this (downtime, no monitor) is "missed": its
    # catch_up decides whether it still fires; later ticks within it always fire.
    schedule_misfire_seconds: float = Field(default=60, ge=0)
    # How long a stopping worker lets running jobs finish before handing them back.
    shutdown_grace_seconds: float = Field(default=10, ge=0)
    # Python logging level of the long-running processes (worker, monitor).
    log_level: str = "INFO"

    # The monitor's leader records an audit checkpoint this often (0: never;
    # `qforge audit checkpoint` still does). Signing key of `qforge audit head`:
    # 64 hex digits (an Ed25519 seed) or the path of a PEM private key.
    audit_checkpoint_seconds: float = Field(default=10, ge=0)
    audit_signing_key: str | None = None

    # One admin token named `api-token` (besides those of `qforge token create`).
    api_token: str | None = None
    # Where `qforge archive` writes segments when --to is not given.
    archive_dir: str | None = None
    # The monitor's leader looks this often for closed partitions of the log to
    # pack (0: never; `qforge pack` still does); packs at most this share of the
    # time, and this smaller one while the queue is busy; and leaves live the
    # partitions within this many positions of the head (catch-ups and recent
    # histories read rows there fastest).
    log_pack_seconds: float = Field(default=60, ge=0)
    log_pack_duty: float = Field(default=0.2, gt=0, le=1)
    log_pack_busy_duty: float = Field(default=0.1, gt=0, le=1)
    log_pack_keep: int = Field(default=10_000_000, ge=0)
    # GET /events/stream also takes ?token= (puts the secret in URLs and access
    # logs: tickets from POST /events/stream-ticket are the way).
    stream_query_token: bool = False
    stream_ticket_seconds: int = Field(default=60, ge=1, le=3600)

    # What a task can see and reach (issue 19). Comma-separated.
    # Variables of the worker a shell step may see besides PATH, HOME, LANG, TZ.
    shell_env_allow: str = ""
    shell_max_memory_mb: int | None = Field(default=None, gt=0)
    shell_max_cpu_seconds: int | None = Field(default=None, gt=0)
    # Hosts and CIDR ranges an http step may call besides public addresses.
    http_allow: str = ""
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    # The longest list a for_each step fans out over (longer ones fail the step).
    max_fan_out: int = Field(default=10_000, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)

    @field_validator("shell_env_allow")
    @classmethod
    def _no_server_secrets(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",") if name.strip()]
        refused = [name for name in names if name.upper().startswith("QFORGE_")]
        if refused:
            raise ValueError(f"QFORGE_* variables are the server's own and never reach a task: {refused}")
        return ",".join(names)

    @field_validator("http_allow")
    @classmethod
    def _hosts_or_ranges(cls, value: str) -> str:
        entries = [entry.strip() for entry in value.split(",") if entry.strip()]
        for entry in entries:
            if "/" in entry:
                ipaddress.ip_network(entry, strict=False)  # ValueError names it
        return ",".join(entries)

    @property
    def shell_env_names(self) -> list[str]:
        return [name for name in self.shell_env_allow.split(",") if name]

    @property
    def http_allow_list(self) -> list[str]:
        return [entry for entry in self.http_allow.split(",") if entry]


def get_settings() -> Settings:
    """Read the settings afresh (cheap), so tests can change the environment between calls."""
    return Settings()
