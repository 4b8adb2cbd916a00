"""Runtime settings, read from ``QFORGE_*`` environment variables and a ``.env`` file (the environment wins)."""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str) -> timedelta:
    """'30d', '12h', '90m', '45s', '2w' (or a number of seconds); ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value)
    if not match:
        raise ValueError(f"not a duration: {value!r} (for example 30d, 12h, 90m, 45s)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


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
    # Behind a connection pooler (CONTRACT.md §7, docs/operations/pgbouncer.md): None (a direct
    # connection) or "transaction" (PgBouncer in transaction pooling mode: no server-side
    # prepared statements, no session state outside a transaction). listen_database_url: a
    # direct connection (bypassing the pooler) for LISTEN and the session advisory locks
    # (monitor leadership, migrate, archive, pack, replay); without it, behind the pooler,
    # LISTEN gives way to polling every poll_interval_seconds.
    pooler: Literal["transaction"] | None = None
    listen_database_url: str | None = None
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
    # The leader also writes every head there as a file of its own, never overwriting one: storage
    # the database's administrators cannot rewrite (`qforge audit verify --witness DIR`).
    audit_witness_dir: str | None = None

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
    # Retention: the monitor's leader archives (to archive_dir) every closed partition of
    # the log whose newest event is older than this, at the packing's shares of the time;
    # and closes the partition being written once its oldest event is this old, so that a
    # quiet log reaches the archive too. Durations: 30d, 12h, 90m, 45s.
    archive_after: timedelta | None = None
    log_partition_max_age: timedelta | None = None
    # GET /events/stream also takes ?token= (puts the secret in URLs and access
    # logs: tickets from POST /events/stream-ticket are the way).
    stream_query_token: bool = False
    stream_ticket_seconds: int = Field(default=60, ge=1, le=3600)

    # What a task can see and reach (issue 19). Comma-separated.
    # Variables of the worker a shell step may see besides PATH, HOME, LANG, TZ.
    shell_env_allow: str = ""
    shell_max_memory_mb: int | None = Field(default=None, gt=0)
    shell_max_cpu_seconds: int | None = Field(default=None, gt=0)
    # Who runs shell steps and where (issue 30, docs/security.md). The user: a name or uid
    # (None: `nobody` when the worker is root, else the worker's own user, which cannot be
    # changed without root). `none`: a network namespace of the step's own, loopback only.
    shell_user: str | None = None
    shell_network: Literal["host", "none"] = "host"
    # Limits of the step's control group, where the machine offers one (memory comes from
    # shell_max_memory_mb); fresh working directories go under shell_work_dir (default:
    # the system's temporary directory).
    shell_max_processes: int | None = Field(default=1024, gt=0)
    shell_max_cpus: float | None = Field(default=None, gt=0)
    shell_work_dir: str | None = None
    # auto: cgroup v2 when it delegates memory/pids/cpu or is all there is, else v1.
    shell_cgroup: Literal["auto", "v1", "v2", "none"] = "auto"
    # Files named by {"secret": "NAME"} in a shell step's env or an http step's headers.
    secrets_dir: str | None = None
    # Hosts and CIDR ranges an http step may call besides public addresses.
    http_allow: str = ""
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    # The longest list a for_each step fans out over (longer ones fail the step).
    max_fan_out: int = Field(default=10_000, gt=0)
    # Who may reach the API from a browser, and how much one request may take (issue 30,
    # docs/security.md). Host names a request may carry in Host (comma-separated; `*` any,
    # `.example.com` a domain and its subdomains); empty: the bound address, localhost,
    # 127.0.0.1 and [::1].
    allowed_hosts: str = ""
    # Field names (besides Authorization, Proxy-Authorization, Cookie, Set-Cookie, and every
    # value of a shell step's `env`) shown as *** to read tokens; comma-separated, any case.
    redact_fields: str = ""
    # (`duplicates` pairs the run of fields below with the worker's above by shape alone: one
    # declaration a setting, nothing to share.)
    # Longest a statement of an API request may run (0: no limit).
    api_statement_timeout_seconds: float = Field(default=30, ge=0)
    # A page of /events, a list, a search or a proof stops once it holds about this many bytes
    # of JSON (at least one item): `next` goes on from there.
    api_page_bytes: int = Field(default=4_194_304, ge=1024)
    # Open /events/stream connections per token (anonymous counts as one token).
    api_streams_per_token: int = Field(default=20, ge=1)
    # Jobs one workflow may create in all (its steps, fan-out elements and its sub-workflows'
    # jobs), and bytes of payload one fan-out may write (elements x payload).
    max_workflow_jobs: int = Field(default=20_000, ge=1)
    max_fan_out_bytes: int = Field(default=67_108_864, ge=1024)
    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)

    @field_validator("archive_after", "log_partition_max_age", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if isinstance(value, str):
            return None if not value.strip() else parse_duration(value)
        return value

    @field_validator("pooler", mode="before")
    @classmethod
    def _pooler_mode(cls, value: object) -> object:
        if isinstance(value, str):
            if not value.strip():
                return None
            if value.strip().lower() != "transaction":
                raise ValueError(f"QFORGE_POOLER={value!r} is not a pooling mode QForge knows: 'transaction' (PgBouncer's"
                                 " pool_mode=transaction) or unset (a direct connection, or a pooler in session mode)")
            return "transaction"
        return value

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
    def redact_names(self) -> frozenset[str]:
        return frozenset(name.strip().lower() for name in self.redact_fields.split(",") if name.strip())

    @property
    def shell_env_names(self) -> list[str]:
        return [name for name in self.shell_env_allow.split(",") if name]

    @property
    def http_allow_list(self) -> list[str]:
        return [entry for entry in self.http_allow.split(",") if entry]


_read: tuple[tuple, Settings] | None = None


def get_settings() -> Settings:
    """The settings as the environment and .env say now (tests change them between calls); read
    again only when a QFORGE_ variable or the .env file changed: building them takes about a
    millisecond, and the hot paths (each completion of a workflow's step) ask every time."""
    global _read
    try:
        env_file = os.stat(".env")
        file_key: tuple = (os.getcwd(), env_file.st_mtime_ns, env_file.st_size, env_file.st_ino)
    except OSError:
        file_key = ()
    key = (tuple(sorted((name.upper(), value) for name, value in os.environ.items()
                        if name[:7].upper() == "QFORGE_")), file_key)
    read = _read
    if read is None or read[0] != key:
        read = _read = (key, Settings())
    return read[1].model_copy()
