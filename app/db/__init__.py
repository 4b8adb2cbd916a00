"""The database: connections and pools, which database to use, the embedded server.

- ``qforge.db.connections``: opening connections and pools (the reconnect
  policy, keepalives, the JSON loader, the transaction-pooler mode) and URLs.
- ``qforge.db.choose``: which URL a process uses (its role's setting,
  ``QFORGE_DATABASE_URL`` or the embedded server) and the roles' passwords.
- ``qforge.db.embedded``: the embedded PostgreSQL server's lifecycle.

Importers use the names below from ``qforge.db``; the modules are how the
package is organised, not a second interface.
"""

from qforge.db.choose import (
    CREDENTIALS_FILE,
    EMBEDDED_SUPERUSER,
    ROLE_KINDS,
    ROLE_URL_SETTINGS,
    embedded_credentials,
    resolve_database_url,
    role_logins,
    role_name,
    set_role_passwords,
    stop_embedded,
)
from qforge.db.connections import (
    CONNECT_TIMEOUT_SECONDS,
    KEEPALIVES,
    Backoff,
    ReconnectingPool,
    behind_pooler,
    connect,
    direct_url,
    json_loads,
    make_pool,
    pooler_kwargs,
    say_polling,
    url_login,
    use_fast_json,
    with_credentials,
    with_database,
)
from qforge.db.embedded import THROWAWAY_CONFIG, CleanupMode, EmbeddedPostgres, EmbeddedPostgresError

__all__ = [
    "CONNECT_TIMEOUT_SECONDS", "CREDENTIALS_FILE", "EMBEDDED_SUPERUSER", "KEEPALIVES", "ROLE_KINDS",
    "ROLE_URL_SETTINGS", "THROWAWAY_CONFIG", "Backoff", "CleanupMode", "EmbeddedPostgres",
    "EmbeddedPostgresError", "ReconnectingPool", "behind_pooler", "connect", "direct_url",
    "embedded_credentials", "json_loads", "make_pool", "pooler_kwargs", "resolve_database_url",
    "role_logins", "role_name", "say_polling", "set_role_passwords", "stop_embedded", "url_login",
    "use_fast_json", "with_credentials", "with_database",
]
