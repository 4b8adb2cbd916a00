-- Reads from a hot standby (QFORGE_READ_DATABASE_URL) that still show a
-- client its own writes: a write's position in the WAL, and whether a
-- standby has replayed that far.

-- name: replication_write_lsn
-- Run on the primary right after a write committed, on the same connection:
-- the insert position is at or past the commit record, so a standby that has
-- replayed this far shows the write (a little past it costs at most a wait
-- for the next records, never a stale read).
SELECT pg_current_wal_insert_lsn()::text AS lsn

-- name: replication_replayed
-- On the standby: has it replayed up to %(lsn)s? pg_last_wal_replay_lsn() is
-- NULL on a server that is not in recovery (a standby since promoted): a
-- primary has every write, hence the coalesce.
SELECT coalesce(pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn, true) AS replayed
