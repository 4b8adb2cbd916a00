-- name: events_append
-- The generic append for commands that locked their streams and know their
-- versions (cancel, retry, trigger, the DAG's decisions, timers). Each event's
-- hash chains to the one before it in its stream: for the first event of a
-- stream here, the head kept on the stream's row (stream_head: any stream type;
-- a new stream starts empty).
-- Positions follow the order of the input (a stream's events in version
-- order, a workflow's own event after its steps').
WITH input AS (
    SELECT e.n, e.stream_type, e.stream_id, e.version, e.type, coalesce(e.schema_version, 1)::smallint AS schema_version,
           coalesce(e.data, '{}') AS data, CASE WHEN e.version = 1 THEN nullif(e.tags, '{}') END AS tags,
           e.workflow_id, coalesce(%(now)s::timestamptz, now()) AS at, coalesce(e.actor, %(actor)s) AS actor
      FROM ROWS FROM (jsonb_to_recordset(%(events)s::jsonb) AS (stream_type text, stream_id uuid,
           version integer, type text, schema_version smallint, data jsonb, tags jsonb,
           workflow_id uuid, actor text))
           WITH ORDINALITY AS e(stream_type, stream_id, version, type, schema_version, data, tags,
                                workflow_id, actor, n)
), headed AS (
    SELECT i.*, CASE WHEN i.version > 1 THEN stream_head(i.stream_type, i.stream_id) END AS prev
      FROM input i
)
INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, tags, workflow_id,
                    occurred_at, actor, hash)
SELECT h.stream_type, h.stream_id, h.version, h.type, h.schema_version, h.data, h.tags, h.workflow_id,
       h.at, h.actor,
       event_chain(h.prev, event_canonical_v1(h.stream_type, h.stream_id, h.version, h.type,
                                              h.schema_version, h.data, h.tags, h.workflow_id, h.at,
                                              h.actor))
           OVER (PARTITION BY h.stream_id ORDER BY h.version)
  FROM headed h
 ORDER BY h.n
RETURNING position, stream_id, type

-- name: events_read
-- The reads of events_of_stream and events_of_workflow (where they say
-- `-- include: events_read`, after their CTE `logged`: the events to read).
-- Readers get the current shape of every event (event_upcast_*) and its
-- stream's tags (stored on a stream's first event only, kept on its row).
SELECT e.position, e.xid, e.stream_type, e.stream_id, e.version, e.type,
       event_upcast_version(e.type, e.schema_version) AS schema_version,
       event_read_data(e.type, e.schema_version, e.data, e.actor, e.occurred_at) AS data,
       coalesce(e.tags, j.tags, w.tags, '{}') AS tags, e.workflow_id, e.occurred_at, e.actor
  FROM logged e
  LEFT JOIN jobs j ON e.stream_type = 'job' AND j.id = e.stream_id
  LEFT JOIN workflows w ON e.stream_type = 'workflow' AND w.id = e.stream_id

-- name: events_of_stream
WITH logged AS (SELECT * FROM log_stream(%(stream_id)s))
-- include: events_read
 ORDER BY e.version

-- name: events_of_workflow
WITH logged AS (SELECT * FROM log_workflow(%(workflow_id)s))
-- include: events_read
 ORDER BY e.position

-- name: events_after
-- The gapless read of the global log: only transactions that no running
-- transaction can precede any more (xid below the snapshot's xmin) are
-- visible, in (xid, position) order, so a late commit is never skipped
-- (events_after_page; events_after_read adds what readers see).
SELECT e.position, e.xid, e.stream_type, e.stream_id, e.version, e.type, e.schema_version, e.data, e.tags,
       e.workflow_id, e.occurred_at, e.actor
  FROM events_after_read(%(after_xid)s::xid8, %(after_position)s::bigint, %(limit)s) e
 ORDER BY e.xid, e.position

-- name: events_tail_cursor
-- Where "the live tail" starts: the last event that a gapless reader can see
-- now, or `back` events before it (a page that opens with a little history).
-- (log_tail_cursor: the live partitions and the packed ones.)
SELECT xid, position FROM log_tail_cursor(%(back)s)

-- name: log_read_lock
-- The first statement (after SET TRANSACTION) of a reader that reads the log
-- over many statements in one snapshot (replay, audit): a packed partition
-- takes a live one's place (log_pack_finish) only once it is done, and its
-- blocks, written before, may postdate the snapshot; taken before the
-- snapshot, this lock makes the swap wait for the reader instead.
LOCK TABLE events, events_packed IN ACCESS SHARE MODE
