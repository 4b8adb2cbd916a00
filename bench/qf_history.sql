-- Set-based generation of a finished history for bench/qf_history.py (its own
-- database only, written with triggers off: see the module's docstring).

-- name: history_id_function
-- A UUIDv7 for millisecond `ms`, unique by `n` in its random part.
CREATE OR REPLACE FUNCTION bench_history_id(ms bigint, n bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '70008000' || lpad(to_hex(n), 12, '0'))::uuid
$$;

-- name: history_events
-- Enqueued, Claimed, Succeeded of jobs lo .. hi-1, as the commands write them
-- (compact data, each event hash-chained to the one before it; a tag
-- {"order": "O-<i>"} on the first, as a shop's jobs would carry), and the rows
-- those events fold to (checked against the fold on a sample).
WITH g AS (
    SELECT i, bench_history_id(%(base_ms)s + i, i) AS id,
           to_timestamp((%(base_ms)s + i) / 1000.0) AS created,
           jsonb_build_object('order', 'O-' || i) AS tags
      FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i
), tagged AS (
    INSERT INTO execution_tags (key, value, kind, id)
    SELECT 'order', 'O-' || g.i, 'job', g.id FROM g
), h1 AS (
    SELECT g.*, event_hash(NULL, 'job', g.id, 1, 'Enqueued', 1::smallint, '{"task": "bench_noop"}', g.tags,
                           NULL, g.created, 'bench-history') AS h1
      FROM g
), h2 AS (
    SELECT h1.*, event_hash(h1.h1, 'job', h1.id, 2, 'Claimed', 1::smallint, '{"attempt": 1}', NULL, NULL,
                            h1.created + interval '1 ms', 'bench-history') AS h2
      FROM h1
), written AS (
    INSERT INTO events (stream_type, stream_id, version, type, data, tags, occurred_at, actor, hash)
    SELECT 'job', h2.id, v.version, v.type, v.data, CASE WHEN v.version = 1 THEN h2.tags END,
           h2.created + v.after, 'bench-history', v.hash
      FROM h2
     CROSS JOIN LATERAL (VALUES
            (1, 'Enqueued', '{"task": "bench_noop"}'::jsonb, interval '0', h2.h1),
            (2, 'Claimed', '{"attempt": 1}'::jsonb, interval '1 ms', h2.h2),
            (3, 'Succeeded', '{"attempt": 1}'::jsonb, interval '2 ms',
             event_hash(h2.h2, 'job', h2.id, 3, 'Succeeded', 1::smallint, '{"attempt": 1}', NULL, NULL,
                        h2.created + interval '2 ms', 'bench-history'))
           ) AS v(version, type, data, after, hash)
     ORDER BY h2.i, v.version
    RETURNING stream_id, version, position, hash, occurred_at, tags
), first_tags AS (
    SELECT stream_id, tags FROM written WHERE version = 1
)
INSERT INTO jobs (id, version, task, queue, status, priority, attempts, free_attempts, max_retries,
                  run_at, timeout_seconds, payload, result, last_error, tags, idempotency_key,
                  workflow_id, step, step_type, depends_on, condition, on_failure, sleep_seconds,
                  worker, heartbeat_at, started_at, finished_at, created_at, updated_at,
                  last_position, chain)
SELECT w.stream_id, 3, 'bench_noop', 'default', 'succeeded', 0, 1, 0, 3,
       w.occurred_at - interval '2 ms', NULL, '{}'::jsonb, 'null'::jsonb, NULL, t.tags, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       'bench-history', w.occurred_at - interval '1 ms', w.occurred_at - interval '1 ms',
       w.occurred_at, w.occurred_at - interval '2 ms', w.occurred_at, w.position, w.hash
  FROM written w JOIN first_tags t USING (stream_id)
 WHERE w.version = 3

-- name: history_partitions
-- Partitions for every position the history takes (the monitor's duty, done
-- once here, before the writers start).
WITH wanted AS (
    UPDATE log_settings SET partitions_ahead = greatest(partitions_ahead, %(positions)s / partition_size + 2)
    RETURNING partitions_ahead
)
SELECT log_maintain() FROM wanted

-- name: history_partition_size
-- Partitions of `size` positions from the start (log_close_current makes the
-- empty ones again at the new size): a history that spans several, as a large
-- log does with the default size.
WITH sized AS (
    UPDATE log_settings SET partition_size = %(size)s RETURNING partition_size
)
SELECT log_close_current() FROM sized

-- name: history_counts
-- The counters the skipped triggers would have kept.
INSERT INTO queue_counts AS c (queue, status, n)
SELECT queue, status, count(*) FROM jobs GROUP BY queue, status
ON CONFLICT (queue, status) DO UPDATE SET n = excluded.n

-- name: history_id
SELECT bench_history_id(%(ms)s, %(n)s)

-- name: history_sizes
-- Bytes of the log (its partitions, with their indexes) and of jobs.
SELECT (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits
         WHERE inhparent = 'events'::regclass)::bigint AS events_bytes,
       pg_total_relation_size('jobs') AS jobs_bytes


-- name: log_sizes
-- Bytes (with TOAST and indexes) and events of the log's live partitions and of
-- its packed ones (qforge pack: events_packed).
SELECT (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits
         WHERE inhparent = 'events'::regclass)::bigint AS live_bytes,
       (SELECT count(*) FROM events) AS live_events,
       (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits
         WHERE inhparent = 'events_packed'::regclass)::bigint AS packed_bytes,
       (SELECT coalesce(sum(events), 0) FROM log_packs WHERE state = 'packed')::bigint AS packed_events
