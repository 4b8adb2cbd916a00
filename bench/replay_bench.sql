-- Queries of bench/replay_bench.py (not part of the app).

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

-- name: bench_fold_all
-- The whole jobs fold in one statement (no chunks, nothing written): the
-- fold's own speed, for comparing implementations of state_next.
SELECT count((f.folded).status) AS n
  FROM (SELECT job_fold(event_upcast(e) ORDER BY e.version) AS folded
          FROM events e WHERE e.stream_type = 'job'
         GROUP BY e.stream_id) f

-- name: bench_state_next_lookup
-- state_next as migrations/0002 first defined it (a query on
-- state_transitions per event), to measure the current one against; rolled back.
CREATE OR REPLACE FUNCTION state_next(p_machine text, p_from text, p_event text, p_wanted text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_status text;
    matches      integer;
BEGIN
    SELECT min(to_status), count(*) INTO found_status, matches
      FROM state_transitions
     WHERE machine = p_machine AND from_status = coalesce(p_from, '')
       AND event_type = p_event AND (p_wanted IS NULL OR to_status = p_wanted);
    IF matches <> 1 THEN
        RAISE EXCEPTION 'illegal % transition: % on status "%" (wanted %)',
            p_machine, p_event, coalesce(p_from, ''), coalesce(p_wanted, '-')
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN found_status;
END $$
