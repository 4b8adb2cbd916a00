-- name: events_append
-- The generic append for commands that locked their streams and know their
-- versions; the (stream_id, version) key rejects a writer that did not.
INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, tags,
                    workflow_id, occurred_at, actor)
SELECT e.stream_type, e.stream_id, e.version, e.type, coalesce(e.schema_version, 1),
       coalesce(e.data, '{}'), coalesce(e.tags, '{}'), e.workflow_id,
       coalesce(%(now)s::timestamptz, now()), coalesce(e.actor, %(actor)s)
  FROM jsonb_to_recordset(%(events)s::jsonb) AS e(stream_type text, stream_id uuid,
       version integer, type text, schema_version smallint, data jsonb, tags jsonb,
       workflow_id uuid, actor text)
RETURNING position, stream_id, type

-- name: events_of_stream
SELECT u.* FROM events e, LATERAL event_upcast(e) u
 WHERE e.stream_id = %(stream_id)s
 ORDER BY e.version

-- name: events_of_workflow
SELECT u.* FROM events e, LATERAL event_upcast(e) u
 WHERE e.workflow_id = %(workflow_id)s
 ORDER BY e.position

-- name: events_after
-- The gapless read of the global log: only transactions that no running
-- transaction can precede any more (xid below the snapshot's xmin) are
-- visible, in (xid, position) order, so a late commit is never skipped.
SELECT u.* FROM events e, LATERAL event_upcast(e) u
 WHERE (e.xid, e.position) > (%(after_xid)s::xid8, %(after_position)s::bigint)
   AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
 ORDER BY e.xid, e.position
 LIMIT %(limit)s

-- name: events_tail_cursor
-- Where "the live tail" starts: the last event that a gapless reader can see
-- now, or `back` events before it (a page that opens with a little history).
SELECT e.xid, e.position
  FROM events e
 WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
 ORDER BY e.xid DESC, e.position DESC
 OFFSET %(back)s
 LIMIT 1
