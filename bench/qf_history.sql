-- Set-based generation of a finished history for bench/qf_history.py (its own
-- database only, written with triggers off: see the module's docstring).

-- name: history_id_function
-- A UUIDv7 for millisecond `ms`, unique by `n` in its random part.
CREATE OR REPLACE FUNCTION bench_history_id(ms bigint, n bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '70008000' || lpad(to_hex(n), 12, '0'))::uuid
$$;

-- name: history_events
-- Enqueued, Claimed, Succeeded of jobs lo .. hi-1, as the commands write them.
INSERT INTO events (stream_type, stream_id, version, type, data, tags, occurred_at, actor)
SELECT 'job', g.id, v.version, v.type, v.data, '{}'::jsonb, g.created + v.after, 'bench-history'
  FROM (SELECT i, bench_history_id(%(base_ms)s + i, i) AS id,
               to_timestamp((%(base_ms)s + i) / 1000.0) AS created
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i) g
 CROSS JOIN LATERAL (VALUES
        (1, 'Enqueued', jsonb_build_object('task', 'bench_noop', 'queue', 'default', 'priority', 0,
                                           'max_retries', 3, 'run_at', g.created,
                                           'payload', '{}'::jsonb, 'status', 'pending'),
         interval '0'),
        (2, 'Claimed', jsonb_build_object('attempt', 1, 'worker', 'bench-history'), interval '1 ms'),
        (3, 'Succeeded', '{"attempt": 1, "result": null}'::jsonb, interval '2 ms')
       ) AS v(version, type, data, after)

-- name: history_jobs
-- The rows those events fold to (checked against job_fold on a sample).
INSERT INTO jobs (id, version, task, queue, status, priority, attempts, free_attempts, max_retries,
                  run_at, timeout_seconds, payload, result, last_error, tags, idempotency_key,
                  workflow_id, step, step_type, depends_on, condition, on_failure, sleep_seconds,
                  worker, heartbeat_at, started_at, finished_at, created_at, updated_at)
SELECT g.id, 3, 'bench_noop', 'default', 'succeeded', 0, 1, 0, 3,
       g.created, NULL, '{}'::jsonb, 'null'::jsonb, NULL, '{}'::jsonb, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       'bench-history', g.created + interval '1 ms', g.created + interval '1 ms',
       g.created + interval '2 ms', g.created, g.created + interval '2 ms'
  FROM (SELECT i, bench_history_id(%(base_ms)s + i, i) AS id,
               to_timestamp((%(base_ms)s + i) / 1000.0) AS created
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i) g

-- name: history_id
SELECT bench_history_id(%(ms)s, %(n)s)

-- name: history_check_sample
-- The fold of a sample of generated streams must equal their rows.
SELECT count(*) FILTER (WHERE f IS DISTINCT FROM j), count(*)
  FROM jobs j,
       LATERAL (SELECT job_fold(e ORDER BY e.version) AS f FROM events e WHERE e.stream_id = j.id) x
 WHERE j.id = ANY(%(ids)s::uuid[])
