-- Queries of bench/replay_bench.py (not part of the app), run against the 0.1.0 schema:
-- the events are 0.1.0's, appended through 0.1.0's projection trigger.

-- name: bench_enqueued
-- Jobs first..last: time-ordered ids (as UUIDv7 are), four queues, a tag on
-- every tenth job; appended through the live projection trigger.
INSERT INTO events (stream_type, stream_id, version, type, data, tags, occurred_at, actor)
SELECT 'job', ('018f0000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 1, 'Enqueued',
       jsonb_build_object('task', 'echo', 'queue', 'q' || mod(i, 4), 'priority', mod(i, 3),
                          'max_retries', 3, 'run_at', '2031-01-01T00:00:00+00:00',
                          'payload', jsonb_build_object('n', i), 'status', 'pending'),
       CASE WHEN mod(i, 10) = 0 THEN jsonb_build_object('tenant', 't' || mod(i, 7))
            ELSE jsonb_build_object() END,
       '2031-01-01T00:00:00+00:00'::timestamptz + i * interval '1 ms', 'bench'
  FROM generate_series(%(first)s::integer, %(last)s::integer) i

-- name: bench_claimed
INSERT INTO events (stream_type, stream_id, version, type, data, occurred_at, actor)
SELECT 'job', ('018f0000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 2, 'Claimed',
       jsonb_build_object('attempt', 1, 'worker', 'bench-' || mod(i, 8)),
       '2031-01-01T01:00:00+00:00'::timestamptz + i * interval '1 ms', 'bench'
  FROM generate_series(%(first)s::integer, %(last)s::integer) i

-- name: bench_succeeded
INSERT INTO events (stream_type, stream_id, version, type, data, occurred_at, actor)
SELECT 'job', ('018f0000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 3, 'Succeeded',
       jsonb_build_object('attempt', 1, 'result', jsonb_build_object('n', i)),
       '2031-01-01T02:00:00+00:00'::timestamptz + i * interval '1 ms', 'bench'
  FROM generate_series(%(first)s::integer, %(last)s::integer) i
