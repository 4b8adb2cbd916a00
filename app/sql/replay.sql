-- Replay: every projection rebuilt from the log by the fold of the live path
-- (events_project(), migrations/definitions/30_fold.sql), applied to the log in
-- position order with the scratch tables first on the search path. Queries
-- with {names} are templates: psycopg.sql fills in the identifiers
-- (qforge/projections/replay/).

-- name: replay_log_extent
-- The positions a replay up to as_of walks through, and how many events.
SELECT coalesce(min(position), 1) AS first_position, coalesce(max(position), 0) AS last_position,
       count(*) AS events
  FROM log_range(0, coalesce(%(as_of)s::bigint + 1, 9223372036854775807))

-- name: replay_search_path
-- The fold writes to the tables it finds first: the scratch ones.
SELECT set_config('search_path', %(path)s, true)

-- name: replay_feed_load
-- One chunk of the log, in position order, into the feed: its fold triggers
-- fold it as they fold a statement's appends (a stream with several events in
-- the chunk takes one round per event). Only the streams in ids (NULL: all),
-- or one share of the streams (parts NULL: all; a parallel replay splits the
-- streams by a byte of their random id).
INSERT INTO {feed}
SELECT e.* FROM {source} e
 WHERE e.position >= %(lo)s AND e.position < %(hi)s
   AND (%(as_of)s::bigint IS NULL OR e.position <= %(as_of)s)
   AND (%(ids)s::uuid[] IS NULL OR e.stream_id = ANY(%(ids)s::uuid[]))
   AND (%(parts)s::integer IS NULL OR get_byte(uuid_send(e.stream_id), 15) %% %(parts)s = %(part)s)
 ORDER BY e.position

-- name: replay_feed_clear
TRUNCATE {feed}

-- name: replay_feed_table
-- What replay inserts the log into: the log's columns, no index, and the
-- log's folds as its triggers (replay_fold_triggers).
CREATE UNLOGGED TABLE {feed} (LIKE {events})

-- name: replay_temp_feed_table
CREATE TEMP TABLE {feed} (LIKE {events}) ON COMMIT DROP

-- name: replay_fold_triggers
-- The folds on the log: its statement triggers after INSERT that read the new
-- rows (events_project, and those of later features). The feed gets the same.
SELECT t.tgname AS name, t.tgnewtable AS new_table, t.tgfoid::regproc::text AS function
  FROM pg_trigger t
 WHERE t.tgrelid = %(events)s::regclass AND NOT t.tgisinternal AND t.tgnewtable IS NOT NULL
 ORDER BY t.tgname

-- name: replay_live_source
-- The live log as replay_feed_load's source: a range of positions, live
-- partitions and packed ones (log_range); or, given ids, those streams' events
-- by key (log_stream: an as-of read or a swap folds a few streams of the whole
-- log). The branch not taken is cut by its one-time filter.
(SELECT e.* FROM log_range(%(lo)s, %(hi)s) e WHERE %(ids)s::uuid[] IS NULL
 UNION ALL
 SELECT e.* FROM unnest(%(ids)s::uuid[]) i(id), log_stream(i.id) e WHERE %(ids)s::uuid[] IS NOT NULL)

-- name: replay_feed_trigger
CREATE TRIGGER {trigger} AFTER INSERT ON {feed}
    REFERENCING NEW TABLE AS {new_table} FOR EACH STATEMENT EXECUTE FUNCTION {function}()

-- name: replay_position_at_time
-- "As of time T" is the longest prefix of the log in which every event
-- occurred at or before T. Positions are handed out at insert and occurred_at
-- is the writing transaction's clock, so the prefix holds every event written
-- before T and none that claims a later time.
SELECT coalesce((SELECT min(position) - 1 FROM log_range(0, 9223372036854775807) e WHERE occurred_at > %(at)s),
                (SELECT coalesce(max(position), 0) FROM log_range(0, 9223372036854775807) e)) AS position

-- name: replay_repeatable_read
-- The first statement of a rebuild: every chunk reads the same snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ

-- name: replay_lock_scratch_session
-- One rebuild or swap at a time: they share the scratch schema; each takes it
-- for its session (a swap spans several transactions).
SELECT pg_advisory_lock(%(key)s)

-- name: replay_unlock_scratch_session
SELECT pg_advisory_unlock(%(key)s)

-- name: replay_live_schema
-- Where the live projections are: a scratch schema must never be that one.
SELECT n.nspname AS schema
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = 'jobs'::regclass

-- name: replay_scratch_exists
SELECT EXISTS (SELECT FROM pg_tables
                WHERE schemaname = %(schema)s AND tablename = %(table)s) AS present

-- name: replay_work_mem
-- A chunk's events are sorted by stream in memory: with the default 4 MB the
-- sort spills to disk and the replay runs at half speed.
SELECT set_config('work_mem', '64MB', true)

-- name: replay_snapshot
SELECT pg_current_snapshot()::text AS snapshot

-- name: replay_streams_since
-- Streams with events that the snapshot of the rebuild did not see: the swap
-- folds them again under its locks. (Their partition may have been packed
-- since: the packed blocks that reach that far are looked at too.)
SELECT e.stream_id FROM events e
 WHERE e.xid >= pg_snapshot_xmin(%(snapshot)s::pg_snapshot)
   AND NOT pg_visible_in_snapshot(e.xid, %(snapshot)s::pg_snapshot)
UNION
SELECT u.stream_id FROM events_packed p, unnest(p.events) u
 WHERE p.max_xid >= pg_snapshot_xmin(%(snapshot)s::pg_snapshot)
   AND u.xid >= pg_snapshot_xmin(%(snapshot)s::pg_snapshot)
   AND NOT pg_visible_in_snapshot(u.xid, %(snapshot)s::pg_snapshot)

-- name: replay_lock_writers
-- Writers append to events and, through events_project() (and the folds it calls),
-- write the projections; EXCLUSIVE blocks them all (row locks included) and lets plain
-- reads (API, dashboard, SSE) go on. Taken with a short lock_timeout and
-- retried: a command holding one of these tables while waiting for another
-- would otherwise deadlock with us.
LOCK TABLE events, workflows, jobs, execution_tags, tokens IN EXCLUSIVE MODE

-- name: replay_lock_timeout
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: replay_table_columns
-- The columns of a projection and which of them form its primary key.
SELECT a.attname AS name, coalesce(a.attnum = ANY(i.indkey), false) AS is_key
  FROM pg_attribute a
  LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
 WHERE a.attrelid = %(table)s::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum

-- name: replay_scratch_reset
DROP SCHEMA IF EXISTS {schema} CASCADE;
CREATE SCHEMA {schema}

-- name: replay_scratch_table
-- Unlogged: a scratch copy is rebuilt from the log, never recovered from WAL.
-- Only the primary key (the fold finds rows by it); fillfactor (the
-- projection's) leaves room on each page for the next versions of its rows,
-- so the fold's updates are HOT: no key entry per version.
CREATE UNLOGGED TABLE {target} (LIKE {source} INCLUDING DEFAULTS) WITH (fillfactor = {fillfactor})

-- name: replay_temp_table
-- The same, for one transaction's own use (verify, as-of reads).
CREATE TEMP TABLE {target} (LIKE {source} INCLUDING DEFAULTS) ON COMMIT DROP

-- name: replay_scratch_key
ALTER TABLE {target} ADD PRIMARY KEY ({keys})

-- name: replay_scratch_meta
-- What a scratch schema holds: the snapshot its rebuild read (the swap folds
-- what came after it) and the position it stops at (NULL: the whole log).
CREATE TABLE {meta} (
    snapshot      pg_snapshot NOT NULL,
    as_of         bigint,
    last_position bigint      NOT NULL,
    events        bigint      NOT NULL,
    built_at      timestamptz NOT NULL DEFAULT now()
)

-- name: replay_scratch_analyze
-- Statistics for the joins of verify and swap, which run right after the
-- rebuild and join on the primary key: the table's size and its key columns'
-- statistics are what they need. (Analyzing every column sorted a sample of
-- each jsonb column: 14% of a rebuild's time, measured with perf.)
ANALYZE {target} ({keys})

-- name: replay_scratch_meta_write
INSERT INTO {meta} (snapshot, as_of, last_position, events)
VALUES (%(snapshot)s::pg_snapshot, %(as_of)s, %(last_position)s, %(events)s)

-- name: replay_scratch_meta_read
SELECT snapshot::text AS snapshot, as_of, last_position, events, built_at FROM {meta}

-- name: replay_scratch_meta_touch
-- After a swap the scratch schema holds the whole log as of the swap.
UPDATE {meta} SET snapshot = pg_current_snapshot(),
                  last_position = (SELECT coalesce(max(position), 0) FROM log_range(0, 9223372036854775807) e)

-- name: replay_forget
DELETE FROM {target} WHERE id = ANY(%(ids)s::uuid[])

-- name: replay_candidates_reset
-- The ids whose live rows the swap must look at under its locks.
DROP TABLE IF EXISTS {candidates};
CREATE TABLE {candidates} (id uuid PRIMARY KEY)

-- name: replay_candidates_mark
-- Before the locks: the rows on which a live projection and the rebuild
-- differ. Under the locks only these and the streams that got events since
-- the rebuild are compared again, so writers wait for the delta, not for a
-- scan of every projection.
INSERT INTO {candidates} (id)
SELECT DISTINCT coalesce(l.id, r.id)
  FROM {live} l
  FULL JOIN {scratch} r ON {join}
 WHERE l.id IS NULL OR r.id IS NULL OR {any_differs}
ON CONFLICT DO NOTHING

-- name: replay_candidates_add
INSERT INTO {candidates} (id) SELECT unnest(%(ids)s::uuid[]) ON CONFLICT DO NOTHING

-- name: replay_swap_delete
DELETE FROM {live} l USING {candidates} k
 WHERE l.id = k.id AND NOT EXISTS (SELECT FROM {scratch} r WHERE {join})

-- name: replay_swap_update
UPDATE {live} l SET {assignments}
  FROM {scratch} r
  JOIN {candidates} k ON k.id = r.id
 WHERE {join} AND ({any_differs})

-- name: replay_swap_insert
INSERT INTO {live} ({columns})
SELECT {scratch_columns}
  FROM {scratch} r
  JOIN {candidates} k ON k.id = r.id
 WHERE NOT EXISTS (SELECT FROM {live} l WHERE {join})

-- name: replay_status_counts
SELECT status, count(*) AS n FROM {target} GROUP BY status ORDER BY status


-- name: replay_row_count
SELECT count(*) AS n FROM {target}

-- name: replay_compare
-- verify: a live projection against its rebuild, a full outer join on the
-- primary key, every column compared with IS DISTINCT FROM.
SELECT {key} AS key, d.columns, l.id IS NULL AS missing, r.id IS NULL AS extra,
       to_jsonb(l) AS live_row, to_jsonb(r) AS rebuilt_row
  FROM {live} l
  FULL JOIN {rebuilt} r ON {join}
 CROSS JOIN LATERAL (SELECT {differing} AS columns) d
 WHERE l.id IS NULL OR r.id IS NULL OR cardinality(d.columns) > 0
 ORDER BY 1

-- name: replay_compare_counts
-- verify: the counter projection (queue_counts plus its pending deltas) against
-- a full count of the live jobs, by queue and status.
SELECT coalesce(c.queue, j.queue) AS queue, coalesce(c.status, j.status) AS status,
       coalesce(c.n, 0) AS counted, coalesce(j.n, 0) AS actual
  FROM (SELECT queue, status, sum(n)::bigint AS n
          FROM (SELECT queue, status, n FROM {counts} UNION ALL SELECT queue, status, n FROM {deltas}) x
         GROUP BY queue, status HAVING sum(n) <> 0) c
  FULL JOIN (SELECT queue, status, count(*) AS n FROM {jobs} GROUP BY queue, status) j
         ON j.queue = c.queue AND j.status = c.status
 WHERE coalesce(c.n, 0) <> coalesce(j.n, 0)
 ORDER BY 1, 2

-- name: replay_workflow_streams
-- A workflow's own stream and its steps' job streams (events_workflow index).
SELECT DISTINCT stream_id FROM log_workflow(%(id)s) WHERE position <= %(position)s

-- name: asof_job
SELECT * FROM pg_temp.jobs WHERE id = %(id)s

-- name: asof_workflow
SELECT * FROM pg_temp.workflows WHERE id = %(id)s

-- name: asof_workflow_steps
SELECT * FROM pg_temp.jobs WHERE workflow_id = %(id)s ORDER BY created_at, step

-- name: replay_export_snapshot
-- A parallel rebuild's folders all read the snapshot of its first transaction.
SELECT pg_export_snapshot() AS id

-- name: replay_import_snapshot
SET TRANSACTION SNAPSHOT {id}

-- name: replay_archive_table
-- The archive's events, loaded from its segments, for replay to fold before
-- the live log: the log's columns, indexed by position as the log is.
CREATE UNLOGGED TABLE {table} (LIKE {events})

-- name: replay_archive_temp_table
CREATE TEMP TABLE {table} (LIKE {events}) ON COMMIT DROP

-- name: replay_archive_copy
COPY {table} (position, xid, stream_type, stream_id, version, type, schema_version, data, tags,
              workflow_id, occurred_at, actor, hash) FROM STDIN

-- name: replay_archive_index
CREATE INDEX ON {table} (position)

-- name: replay_archive_extent
SELECT coalesce(min(position), 1) AS first_position, coalesce(max(position), 0) AS last_position,
       count(*) AS events
  FROM {table}
 WHERE %(as_of)s::bigint IS NULL OR position <= %(as_of)s

-- name: replay_archive_exists
SELECT to_regclass(%(table)s) IS NOT NULL AS present
