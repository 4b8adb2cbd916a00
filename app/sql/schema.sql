-- The schema runner's own bookkeeping (qforge.migrate).

-- name: schema_lock
-- One runner at a time; the others wait here, then find nothing to do.
SELECT pg_advisory_lock(%(key)s)

-- name: schema_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: schema_bootstrap
-- The record of what is applied. 0.1.0 kept only names; the checksum and the
-- kind (versioned file or repeatable definition) came with 0.2.0. Run as one
-- simple-protocol query, first in the migrating transaction.
CREATE TABLE IF NOT EXISTS schema_migrations (
    name       text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text;
ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'versioned'

-- name: schema_table_exists
SELECT to_regclass('schema_migrations') IS NOT NULL AS present

-- name: schema_table_has_checksums
SELECT EXISTS (SELECT FROM pg_attribute
                WHERE attrelid = 'schema_migrations'::regclass AND attname = 'checksum'
                  AND NOT attisdropped) AS present

-- name: schema_recorded
SELECT name, kind, checksum, applied_at FROM schema_migrations ORDER BY name

-- name: schema_recorded_legacy
SELECT name, 'versioned' AS kind, NULL::text AS checksum, applied_at
  FROM schema_migrations ORDER BY name

-- name: schema_record
INSERT INTO schema_migrations (name, kind, checksum)
VALUES (%(name)s, %(kind)s, %(checksum)s)
ON CONFLICT (name) DO UPDATE
   SET kind = excluded.kind, checksum = excluded.checksum, applied_at = now()

-- name: schema_rename_legacy
-- A file renamed before checksums existed: the row takes the file's name.
UPDATE schema_migrations SET name = %(new)s
 WHERE name = %(old)s AND NOT EXISTS (SELECT FROM schema_migrations WHERE name = %(new)s)

-- name: schema_forget
DELETE FROM schema_migrations WHERE name = %(name)s

-- name: schema_adopt
-- A file recorded by 0.1.0 (names only) gets the checksum of the released
-- file; when it was applied stays as recorded.
UPDATE schema_migrations SET checksum = %(checksum)s, kind = 'versioned' WHERE name = %(name)s


-- name: schema_has_roles
SELECT to_regprocedure('roles_apply(text)') IS NOT NULL AS present

-- name: schema_roles_apply
-- The processes' roles and their privileges (definitions/90_roles.sql), after every migration.
SELECT roles_apply(%(prefix)s)
