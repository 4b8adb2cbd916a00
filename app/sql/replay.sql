-- Replay: every projection rebuilt from the log with the fold functions of the
-- live path (migrations/0002: job_fold/workflow_fold are the aggregates of
-- job_apply/workflow_apply, which events_project() applies on every insert).
--
-- The fold queries read one chunk of streams, [lo, hi) by stream id (hi NULL:
-- to the end), or the streams in ids (NULL: all), up to log position as_of
-- (NULL: all). They are run with prepare=False so that each is planned with
-- its parameters and the unused conditions fold away. Queries with {names}
-- are templates: psycopg.sql fills in the identifiers (app/projections/replay.py).

-- name: replay_jobs
-- The fold runs in a subquery, once per stream: (job_fold(...)).* would run it
-- once per column.
SELECT (f.folded).*
  FROM (SELECT job_fold(event_upcast(e) ORDER BY e.version) AS folded
          FROM events e
         WHERE e.stream_type = 'job'
           AND e.stream_id >= %(lo)s AND (%(hi)s::uuid IS NULL OR e.stream_id < %(hi)s)
           AND (%(ids)s::uuid[] IS NULL OR e.stream_id = ANY(%(ids)s::uuid[]))
           AND (%(as_of)s::bigint IS NULL OR e.position <= %(as_of)s)
         GROUP BY e.stream_id) f

-- name: replay_workflows
SELECT (f.folded).*
  FROM (SELECT workflow_fold(event_upcast(e) ORDER BY e.version) AS folded
          FROM events e
         WHERE e.stream_type = 'workflow'
           AND e.stream_id >= %(lo)s AND (%(hi)s::uuid IS NULL OR e.stream_id < %(hi)s)
           AND (%(ids)s::uuid[] IS NULL OR e.stream_id = ANY(%(ids)s::uuid[]))
           AND (%(as_of)s::bigint IS NULL OR e.position <= %(as_of)s)
         GROUP BY e.stream_id) f

-- name: replay_execution_tags
-- Tags are fixed at creation: the first event of each stream carries them
-- (the rule of the INSERT INTO execution_tags in events_project()).
SELECT t.key, t.value, e.stream_type AS kind, e.stream_id AS id
  FROM events e, LATERAL jsonb_each_text(e.tags) t
 WHERE e.version = 1 AND e.tags <> '{}'
   AND e.stream_id >= %(lo)s AND (%(hi)s::uuid IS NULL OR e.stream_id < %(hi)s)
   AND (%(ids)s::uuid[] IS NULL OR e.stream_id = ANY(%(ids)s::uuid[]))
   AND (%(as_of)s::bigint IS NULL OR e.position <= %(as_of)s)

-- name: replay_chunk_end
-- Where the chunk starting at lo ends: the stream about `size` events further
-- in stream id order (a walk of the (stream_id, version) index). Chunks end
-- on stream boundaries, so every stream is folded whole; NULL: the last chunk.
SELECT stream_id FROM events
 WHERE stream_id > %(lo)s
 ORDER BY stream_id
OFFSET %(size)s
 LIMIT 1

-- name: replay_log_extent
-- How many events a replay up to as_of folds and the position it stops at;
-- and how many the chunks walk through (all of them: streams go on past as_of).
SELECT count(*) FILTER (WHERE %(as_of)s::bigint IS NULL OR position <= %(as_of)s) AS events,
       coalesce(max(position) FILTER (WHERE %(as_of)s::bigint IS NULL OR position <= %(as_of)s),
                0) AS last_position,
       count(*) AS scanned
  FROM events

-- name: replay_position_at_time
-- "As of time T" is the longest prefix of the log in which every event
-- occurred at or before T. Positions are handed out at insert and occurred_at
-- is the writing transaction's clock, so the prefix holds every event written
-- before T and none that claims a later time.
SELECT coalesce((SELECT min(position) - 1 FROM events WHERE occurred_at > %(at)s),
                (SELECT coalesce(max(position), 0) FROM events)) AS position

-- name: replay_repeatable_read
-- The first statement of a rebuild: every chunk reads the same snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ

-- name: replay_read_only_snapshot
-- The first statement of a verify: one snapshot for the folds and the live
-- rows, and a promise to write nothing.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: replay_lock_scratch
-- One rebuild or swap at a time: they share the scratch schema. A rebuild
-- takes it for its transaction, a swap for its session (it spans several).
SELECT pg_advisory_xact_lock(%(key)s)

-- name: replay_lock_scratch_session
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
-- folds them again under its locks.
SELECT DISTINCT stream_id FROM events
 WHERE xid >= pg_snapshot_xmin(%(snapshot)s::pg_snapshot)
   AND NOT pg_visible_in_snapshot(xid, %(snapshot)s::pg_snapshot)

-- name: replay_lock_writers
-- Writers append to events and, through events_project(), write the three
-- projections; EXCLUSIVE blocks them all (row locks included) and lets plain
-- reads (API, dashboard, SSE) go on. Taken with a short lock_timeout and
-- retried: a command holding one of these tables while waiting for another
-- would otherwise deadlock with us.
LOCK TABLE events, workflows, jobs, execution_tags IN EXCLUSIVE MODE

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
-- Without indexes while it is loaded; the primary key comes afterwards
-- (replay_scratch_key), the live table's other indexes are not needed here.
CREATE UNLOGGED TABLE {target} (LIKE {source} INCLUDING ALL EXCLUDING INDEXES)

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
-- Statistics for the swap's joins, which run right after the rebuild.
ANALYZE {target}

-- name: replay_scratch_meta_write
INSERT INTO {meta} (snapshot, as_of, last_position, events)
VALUES (%(snapshot)s::pg_snapshot, %(as_of)s, %(last_position)s, %(events)s)

-- name: replay_scratch_meta_read
SELECT snapshot::text AS snapshot, as_of, last_position, events, built_at FROM {meta}

-- name: replay_scratch_meta_touch
-- After a swap the scratch schema holds the whole log as of the swap.
UPDATE {meta} SET snapshot = pg_current_snapshot(),
                  last_position = (SELECT coalesce(max(position), 0) FROM events)

-- name: replay_insert
-- One chunk of folded rows into a scratch table.
WITH written AS (INSERT INTO {target} {fold} RETURNING 1)
SELECT count(*) AS n FROM written

-- name: replay_forget
DELETE FROM {target} WHERE id = ANY(%(ids)s::uuid[])

-- name: replay_compare
-- verify: one chunk of a live projection against its rebuild, a full outer
-- join on the primary key, every column compared with IS DISTINCT FROM.
WITH rebuilt AS ({fold}),
     live AS (SELECT * FROM {live} t
               WHERE t.id >= %(lo)s AND (%(hi)s::uuid IS NULL OR t.id < %(hi)s))
SELECT {key} AS key, d.columns, l.id IS NULL AS missing, r.id IS NULL AS extra,
       to_jsonb(l) AS live_row, to_jsonb(r) AS rebuilt_row
  FROM live l
  FULL JOIN rebuilt r ON {join}
 CROSS JOIN LATERAL (SELECT {differing} AS columns) d
 WHERE l.id IS NULL OR r.id IS NULL OR cardinality(d.columns) > 0
 ORDER BY 1

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

-- name: job_as_of
-- A job as it was once the log reached `position`: the fold of its events up
-- to there (the aggregate of no events is NULL: the job did not exist yet).
SELECT (f.folded).*
  FROM (SELECT job_fold(event_upcast(e) ORDER BY e.version) AS folded
          FROM events e
         WHERE e.stream_id = %(id)s AND e.stream_type = 'job'
           AND e.position <= %(position)s) f
 WHERE (f.folded).id IS NOT NULL

-- name: workflow_as_of
SELECT (f.folded).*
  FROM (SELECT workflow_fold(event_upcast(e) ORDER BY e.version) AS folded
          FROM events e
         WHERE e.stream_id = %(id)s AND e.stream_type = 'workflow'
           AND e.position <= %(position)s) f
 WHERE (f.folded).id IS NOT NULL

-- name: workflow_steps_as_of
-- The steps' job streams carry workflow_id: one range of events_workflow.
SELECT (f.folded).*
  FROM (SELECT job_fold(event_upcast(e) ORDER BY e.version) AS folded
          FROM events e
         WHERE e.workflow_id = %(id)s AND e.stream_type = 'job'
           AND e.position <= %(position)s
         GROUP BY e.stream_id) f
