-- name: audit_lock
-- One checkpointer at a time (the monitor's leader, `qforge audit checkpoint`):
-- each checkpoint chains to the one before, so two at once would fork the chain
-- (the primary key would refuse the second, after all its work).
SELECT pg_advisory_xact_lock(%(key)s)

-- name: audit_last
SELECT seq, hash, cursor_xid::text::bigint AS cursor_xid, cursor_position
  FROM audit_checkpoints
 ORDER BY seq DESC
 LIMIT 1

-- name: audit_now
SELECT now() AS now

-- name: audit_pending
-- The events a new checkpoint covers: those a gapless reader can see now (xid
-- below the snapshot's xmin, so no transaction still running can add one before
-- them) after the previous checkpoint's cursor, in (xid, position) order: the
-- order that never changes once a checkpoint has seen it.
-- (events_after_page: the live partitions and the packed ones.)
SELECT e.xid::text::bigint AS xid, e.position, e.hash
  FROM events_after_page(%(xid)s::text::xid8, %(position)s::bigint, %(limit)s) e
 ORDER BY e.xid, e.position

-- name: audit_checkpoint_insert
INSERT INTO audit_checkpoints (seq, created_at, cursor_xid, cursor_position, events, positions, hashes,
                               root, prev, hash)
VALUES (%(seq)s, %(created_at)s, %(cursor_xid)s::text::xid8, %(cursor_position)s, %(events)s, %(positions)s,
        %(hashes)s, %(root)s, %(prev)s, %(hash)s)

-- name: audit_head
-- The newest checkpoint (or checkpoint seq), with the range of positions it
-- covers (for people: the hash binds the leaves, not these two).
SELECT seq, created_at, cursor_xid::text::bigint AS cursor_xid, cursor_position, events, root, prev, hash,
       (SELECT min(p) FROM unnest(positions) p) AS first_position,
       (SELECT max(p) FROM unnest(positions) p) AS last_position
  FROM audit_checkpoints
 WHERE %(seq)s::bigint IS NULL OR seq = %(seq)s
 ORDER BY seq DESC
 LIMIT 1

-- name: audit_checkpointed_events
-- How many events the checkpoints cover (what verify's walk of them goes through).
SELECT coalesce(sum(events), 0)::bigint AS n FROM audit_checkpoints

-- name: audit_checkpoint_headers
-- Checkpoints in chain order, with or without their leaves (verify walks them
-- all; a proof needs only the headers after the ones that cover its events).
SELECT seq, created_at, cursor_xid::text::bigint AS cursor_xid, cursor_position, events, root, prev, hash,
       CASE WHEN %(leaves)s THEN positions END AS positions, CASE WHEN %(leaves)s THEN hashes END AS hashes
  FROM audit_checkpoints
 WHERE seq >= %(from_seq)s
 ORDER BY seq

-- name: audit_chain_breaks
-- Every event checked on its own: its stored hash against SHA-256 of the
-- stored hash before it in its stream (or, for a stream whose older events
-- were archived, the archive's last hash of it) and its own canonical bytes,
-- and its version against the one before it. An edited event fails the first
-- test; an event re-hashed to pass it moves the failure to the next event of
-- its stream; a deleted one leaves a gap in the versions. The last event of a
-- stream is also checked against the head of the chain kept on the stream's
-- row (the next append chains to it): deleting a stream's newest events
-- leaves them apart.
WITH archived AS (
    SELECT * FROM unnest(%(archived_ids)s::uuid[], %(archived_versions)s::integer[],
                         %(archived_hashes)s::bytea[]) AS a(stream_id, version, hash)
), checked AS (
    SELECT e.position, e.stream_id, e.version, e.hash,
           -- Without the archive at hand, where a stream goes on from archived events
           -- cannot be checked here (the checkpoints still cover every live event).
           coalesce(lag(e.version) OVER w, a.version,
                    CASE WHEN %(archive_unread)s THEN e.version - 1 ELSE 0 END) AS prev_version,
           (lag(e.hash) OVER w IS NULL AND a.hash IS NULL AND e.version > 1 AND %(archive_unread)s)
           OR e.hash = sha256(coalesce(lag(e.hash) OVER w, a.hash, ''::bytea)
                              || event_canonical_v1(e.stream_type, e.stream_id, e.version, e.type,
                                                    e.schema_version, e.data, e.tags, e.workflow_id,
                                                    e.occurred_at, e.actor)) AS hash_holds,
           lead(e.version) OVER w IS NULL AS last_of_stream, e.stream_type
      FROM log_range(0, 9223372036854775807) e
      LEFT JOIN archived a ON a.stream_id = e.stream_id
    WINDOW w AS (PARTITION BY e.stream_id ORDER BY e.version, e.position)
)
SELECT * FROM (
    SELECT c.position, c.stream_id, c.version, c.prev_version, c.hash_holds,
           coalesce(j.chain, w.chain) IS NULL OR coalesce(j.chain, w.chain) = c.hash AS head_holds,
           coalesce(j.last_position, w.last_position) AS row_position
      FROM checked c
      LEFT JOIN jobs j ON c.last_of_stream AND c.stream_type = 'job' AND j.id = c.stream_id
      LEFT JOIN workflows w ON c.last_of_stream AND c.stream_type = 'workflow' AND w.id = c.stream_id
) r
 WHERE NOT r.hash_holds OR r.version <> r.prev_version + 1 OR NOT r.head_holds
 ORDER BY r.position

-- name: audit_events_count
SELECT count(*) AS n FROM log_range(0, 9223372036854775807) e

-- name: audit_checkpoint_diff
-- The log against what the checkpoints recorded of it, position by position:
-- every event at or below the newest checkpoint's cursor (in the gapless
-- order) must be a leaf of a checkpoint with the same hash, and every leaf
-- must still be there (in the live log or, given, in the archive). This is
-- what catches a stream rewritten with a self-consistent chain, an event
-- inserted with a valid hash, or two events swapped.
WITH newest AS (
    SELECT cursor_xid, cursor_position FROM audit_checkpoints ORDER BY seq DESC LIMIT 1
), stored AS (
    SELECT c.seq, p.position, substring(c.hashes FROM (p.i::integer - 1) * 32 + 1 FOR 32) AS hash
      FROM audit_checkpoints c, unnest(c.positions) WITH ORDINALITY AS p(position, i)
), present AS (
    SELECT e.position, e.hash, e.stream_id
      FROM log_range(0, 9223372036854775807) e, newest n
     WHERE e.xid <= n.cursor_xid AND (e.xid, e.position) <= (n.cursor_xid, n.cursor_position)
    UNION ALL
    SELECT a.position, a.hash, a.stream_id
      FROM unnest(%(archived_positions)s::bigint[], %(archived_hashes)s::bytea[], %(archived_ids)s::uuid[])
           AS a(position, hash, stream_id)
)
SELECT coalesce(s.position, p.position) AS position, s.seq, p.stream_id, s.hash AS recorded, p.hash AS present
  FROM stored s
  FULL JOIN present p ON p.position = s.position
 WHERE s.hash IS DISTINCT FROM p.hash
   -- Archived (recorded in archive_segments) and the archive not read: not checked here.
   AND NOT (p.hash IS NULL AND s.position < %(unchecked_below)s)
 ORDER BY 1

-- name: audit_archive_extent
-- Below `archived_upper` events may have left for archive segments; from
-- `live_lower` on they are in the log's attached partitions, live or packed.
SELECT (SELECT coalesce(max(upper_position), 0) FROM archive_segments) AS archived_upper,
       coalesce(least((SELECT min(lower) FROM log_partitions()),
                      (SELECT min(lower_position) FROM log_packs WHERE state = 'packed')), 1) AS live_lower

-- name: audit_proof_owner
-- The execution's own stream's first event (does the proof exist, and of which kind?).
SELECT e.stream_id, e.stream_type FROM log_stream(%(id)s) e LIMIT 1

-- name: audit_proof_events
-- An execution's events as stored (the jsonb as the hash covers its text), with
-- the checkpoint that covers each: the first whose cursor is at or after it.
-- A workflow's proof holds its own stream and its steps' whole job streams.
-- After (stream id, version), at most `limit` (NULL: all): GET .../proof reads a page at a time.
SELECT e.position, e.xid::text::bigint AS xid, e.stream_type, e.stream_id, e.version, e.type, e.schema_version,
       e.data::text AS data_text, e.tags::text AS tags_text, e.workflow_id, e.occurred_at, e.actor, e.hash,
       (SELECT c.seq FROM audit_checkpoints c
         WHERE (c.cursor_xid, c.cursor_position) >= (e.xid, e.position)
         ORDER BY c.cursor_xid, c.cursor_position LIMIT 1) AS checkpoint
  FROM (SELECT * FROM log_stream(%(id)s)
        UNION
        SELECT s.* FROM (SELECT DISTINCT w.stream_id FROM log_workflow(%(id)s) w) ws, log_stream(ws.stream_id) s) e
 WHERE (e.stream_id, e.version) > (%(after_stream)s::uuid, %(after_version)s::integer)
 ORDER BY e.stream_id, e.version, e.position
 LIMIT %(limit)s

-- name: audit_checkpoint_headers_page
SELECT seq, created_at, cursor_xid::text::bigint AS cursor_xid, cursor_position, events, root, prev, hash
  FROM audit_checkpoints
 WHERE seq >= %(from_seq)s
 ORDER BY seq
 LIMIT %(limit)s

-- name: audit_checkpoint_leaves
SELECT seq, positions, hashes FROM audit_checkpoints WHERE seq = ANY(%(seqs)s)

-- name: audit_covering
-- The checkpoint that covers each (xid, position) given (archived events: the
-- checkpoints stay in the database when their events leave for the archive).
SELECT p.position,
       (SELECT c.seq FROM audit_checkpoints c
         WHERE (c.cursor_xid, c.cursor_position) >= (p.xid::text::xid8, p.position)
         ORDER BY c.cursor_xid, c.cursor_position LIMIT 1) AS checkpoint
  FROM unnest(%(xids)s::bigint[], %(positions)s::bigint[]) AS p(xid, position)
