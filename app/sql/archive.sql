-- qforge archive: partitions of the log written out as segments, verified,
-- recorded, then detached and dropped (app/log/archive.py).

-- name: archive_close_current
SELECT log_close_current() AS boundary

-- name: archive_current_since
-- When the oldest event of the partition being written occurred (NULL: it is
-- empty): the monitor closes it once that is QFORGE_LOG_PARTITION_MAX_AGE ago.
SELECT (SELECT e.occurred_at FROM events e
         WHERE e.position >= p.lower AND e.position < p.upper
         ORDER BY e.position LIMIT 1) AS since
  FROM log_partitions() p
 WHERE log_next_position() >= p.lower AND log_next_position() < p.upper

-- name: archive_settle_lock
-- Every transaction that appended holds ROW EXCLUSIVE on events until it ends
-- (taken before its positions are: the parent is locked when the INSERT
-- starts). SHARE waits for them all and holds new ones off for the moment it
-- takes to read the sequence: every position handed out before is then
-- committed or never will be. (Through log_settle_lock(), SECURITY DEFINER: a
-- SHARE lock needs a write privilege on events that no process's role holds.)
SELECT log_settle_lock()

-- name: archive_settled_position
SELECT log_next_position() AS horizon

-- name: archive_log_position
-- How far the log has come (the sequence, no lock): the archive's Pace reads it
-- at every rest to tell a busy queue from a quiet one.
SELECT log_next_position()

-- name: archive_partitions
-- The log's partitions from the archived prefix on, oldest first, and whether
-- every position in them is settled (below the horizon of archive_settle_lock):
-- the live ones, and the packed ones (qforge pack: closed).
SELECT p.partition::text AS partition, p.lower, p.upper,
       p.upper <= %(horizon)s AS closed, false AS packed
  FROM log_partitions() p
 WHERE p.lower >= log_archived_before()
UNION ALL
SELECT log_pack_table(l.lower_position), l.lower_position, l.upper_position, true, true
  FROM log_packs l
 WHERE l.state = 'packed' AND l.lower_position >= log_archived_before()
 ORDER BY 2

-- name: archive_partition_last_occurred
SELECT max(occurred_at) AS last_occurred_at FROM {partition}

-- name: archive_partition_lines
-- A partition's events in position order, each as the JSON line of its
-- segment (app/log/segments.py), built here rather than in Python: data and
-- tags as the exact jsonb text the hash covers, occurred_us as the canonical
-- encoding holds it (microseconds since 2000-01-01 UTC). The field order is
-- the format's (LINE_HEAD and LINE_TAIL match it). In COPY's text format the
-- only escaping these lines get is a doubled backslash (JSON text holds no
-- raw tab, newline or other control character). A window of positions at a
-- time (archive.py READ_WINDOW): the BRIN index finds its blocks and its sort
-- fits in memory, where the whole partition would be sorted on disk.
COPY (SELECT json_build_object(
                 'position', position, 'xid', xid::text, 'stream_type', stream_type, 'stream_id', stream_id,
                 'version', version, 'type', type, 'schema_version', schema_version,
                 'occurred_at', to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                 'occurred_us', ((extract(epoch FROM occurred_at) - 946684800) * 1000000)::bigint,
                 'actor', actor, 'workflow_id', workflow_id, 'tags', tags::text, 'data', data::text,
                 'hash', encode(hash, 'hex'))
        FROM {partition} WHERE position >= %(from)s AND position < %(to)s ORDER BY position) TO STDOUT

-- name: archive_partition_summary
-- What the manifest says of a partition besides its lines: counts, time range,
-- schema versions per event type.
SELECT count(*) AS events, min(position) AS first_position, max(position) AS last_position,
       min(occurred_at) AS first_occurred_at, max(occurred_at) AS last_occurred_at,
       coalesce((SELECT jsonb_object_agg(type, versions) FROM (
                    SELECT type, jsonb_agg(DISTINCT schema_version ORDER BY schema_version) AS versions
                      FROM {partition} GROUP BY type) v), '{{}}') AS schema_versions
  FROM {partition}

-- name: archive_segments_recorded
SELECT segment, lower_position, upper_position, first_position, last_position, events, sha256,
       state, manifest
  FROM archive_segments ORDER BY lower_position

-- name: archive_record
-- The segment is on disk and verified: record it, sealed. Idempotent: a
-- rerun after a crash between here and the drop finds it already recorded.
INSERT INTO archive_segments (segment, lower_position, upper_position, first_position, last_position,
                              events, first_occurred_at, last_occurred_at, sha256, bytes, raw_bytes,
                              streams, bloom_hashes, manifest, state)
VALUES (%(segment)s, %(lower)s, %(upper)s, %(first_position)s, %(last_position)s, %(events)s,
        %(first_occurred_at)s, %(last_occurred_at)s, %(sha256)s, %(bytes)s, %(raw_bytes)s,
        %(streams)s, %(bloom_hashes)s, %(manifest)s, 'sealed')
ON CONFLICT (segment) DO NOTHING

-- name: archive_release
SELECT jobs_released, workflows_released
  FROM archive_release(%(before)s, %(job_done)s::text[], %(workflow_done)s::text[])

-- name: archive_release_workflows
-- One window of positions of the partition being archived (see
-- archive_release_workflows in 50_log_partitions.sql), its own transaction.
SELECT jobs_released, workflows_released
  FROM archive_release_workflows(%(before)s, %(job_done)s::text[], %(workflow_done)s::text[], %(from)s, %(to)s)

-- name: archive_release_jobs
-- One window of positions of the partition being archived (see
-- archive_release_jobs in 50_log_partitions.sql), its own transaction.
SELECT jobs_released FROM archive_release_jobs(%(before)s, %(job_done)s::text[], %(from)s, %(to)s)

-- name: archive_allow
-- This session may detach and drop partitions of the log (log_guard_ddl). And
-- it is a batch job beside a live queue: no parallel workers (a parallel scan
-- and sort of a partition would take every core from the appends).
SELECT set_config('qforge.archiving', 'on', false), set_config('max_parallel_workers_per_gather', '0', false)

-- name: archive_detach
-- CONCURRENTLY: appends and reads of the other partitions go on meanwhile.
-- It runs as two transactions; a crash between them leaves the partition
-- "detach pending", which archive_detach_finalize completes. ({log}: events,
-- or events_packed for a packed partition.)
ALTER TABLE {log} DETACH PARTITION {partition} CONCURRENTLY

-- name: archive_detach_finalize
ALTER TABLE {log} DETACH PARTITION {partition} FINALIZE

-- name: archive_pack_state
-- Whether the partition at `lower` is packed, or being packed (its blocks'
-- table beside the log, to go with it).
SELECT state FROM log_packs WHERE lower_position = %(lower)s

-- name: archive_pack_forget
-- The partition is archived and gone: so is its record of packing.
DELETE FROM log_packs WHERE lower_position = %(lower)s

-- name: archive_let_go_lock
-- qforge archive and qforge pack both take partitions out of the live log: one
-- at a time (a session lock: each runs as many short transactions). The
-- archive waits for it; the monitor's packing does not (archive_let_go_try_lock).
SELECT pg_advisory_lock(%(key)s)

-- name: archive_let_go_try_lock
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: archive_let_go_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: archive_detached_table
-- The partition's table if it still exists, whether it is attached, and
-- whether a detach was begun and not finished (a crash between DETACH
-- CONCURRENTLY's two transactions).
SELECT t.r::text AS name, i.inhrelid IS NOT NULL AS attached, coalesce(i.inhdetachpending, false) AS pending
  FROM (SELECT to_regclass(%(name)s) AS r) t
  LEFT JOIN pg_inherits i ON i.inhrelid = t.r

-- name: archive_drop
DROP TABLE {partition}

-- name: archive_owns_log
-- Whether this session may detach partitions of the log itself (CONCURRENTLY),
-- or must ask log_archive_let_go() (the monitor's role).
SELECT pg_has_role((SELECT relowner FROM pg_class WHERE oid = 'events'::regclass), 'MEMBER') AS owner

-- name: archive_let_go_for_role
SELECT log_archive_let_go(%(lower)s)

-- name: archive_mark_dropped
UPDATE archive_segments SET state = 'dropped', dropped_at = now()
 WHERE segment = %(segment)s AND state = 'sealed'

-- name: archive_holding
-- The archive segments that may hold stream `id` (Bloom filters: rarely one
-- that does not), oldest first.
SELECT segment, first_position, last_position
  FROM archive_segments
 WHERE archive_bloom_has(streams, bloom_hashes, %(id)s)
 ORDER BY lower_position

-- name: archive_live_start
-- Where the live log starts: its oldest partition still attached, live or packed.
SELECT least((SELECT min(lower) FROM log_partitions()),
             (SELECT min(lower_position) FROM log_packs WHERE state = 'packed')) AS lower

-- name: archive_drop_if_exists
DROP TABLE IF EXISTS {partition}
