-- Prototypes measured by bench/qf_variants.py, installed only in its own scratch
-- databases. They are evidence for proposals, not part of the schema.

-- name: bench_projection_set_based
-- The live projection without the per-stream plpgsql fold, for the three event
-- types of a plain job's life: Enqueued becomes an INSERT of the row,
-- Claimed/Succeeded/Heartbeat one UPDATE of the rows, all set-based. Each
-- column is what job_apply() computes for that event (qf_variants.py checks
-- every row against job_fold afterwards). A real fast path would fall back to
-- the fold for any other event type or for several events of one stream.
CREATE FUNCTION bench_projection_set_based() RETURNS trigger LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off AS $$
BEGIN
    INSERT INTO jobs (id, version, task, queue, status, priority, attempts, free_attempts, max_retries,
                      run_at, timeout_seconds, payload, result, last_error, tags, idempotency_key,
                      workflow_id, step, step_type, depends_on, condition, on_failure, sleep_seconds,
                      worker, heartbeat_at, started_at, finished_at, created_at, updated_at)
    SELECT e.stream_id, e.version, e.data ->> 'task', e.data ->> 'queue',
           state_next('job', NULL, 'Enqueued', e.data ->> 'status'),
           (e.data ->> 'priority')::integer, 0, 0, (e.data ->> 'max_retries')::integer,
           (e.data ->> 'run_at')::timestamptz, (e.data ->> 'timeout_seconds')::double precision,
           coalesce(e.data -> 'payload', '{}'), NULL, NULL, e.tags, e.data ->> 'idempotency_key',
           e.workflow_id, e.data ->> 'step', e.data ->> 'step_type', e.data -> 'depends_on',
           e.data -> 'when', e.data ->> 'on_failure', (e.data ->> 'seconds')::double precision,
           NULL, NULL, NULL, NULL, e.occurred_at, e.occurred_at
      FROM new_events e
     WHERE e.version = 1;

    UPDATE jobs j
       SET status = state_next('job', j.status, e.type, NULL),
           version = e.version,
           updated_at = e.occurred_at,
           attempts = CASE WHEN e.type = 'Claimed' THEN (e.data ->> 'attempt')::integer ELSE j.attempts END,
           worker = CASE WHEN e.type = 'Claimed' THEN e.data ->> 'worker' ELSE j.worker END,
           heartbeat_at = CASE WHEN e.type IN ('Claimed', 'Heartbeat') THEN e.occurred_at
                               ELSE j.heartbeat_at END,
           started_at = CASE WHEN e.type = 'Claimed' THEN e.occurred_at ELSE j.started_at END,
           result = CASE WHEN e.type = 'Succeeded' THEN e.data -> 'result' ELSE j.result END,
           finished_at = CASE WHEN e.type = 'Succeeded' THEN e.occurred_at ELSE j.finished_at END
      FROM new_events e
     WHERE e.version > 1 AND j.id = e.stream_id AND j.version = e.version - 1;

    PERFORM pg_notify('qforge_jobs', x.queue)
       FROM (SELECT DISTINCT e.data ->> 'queue' AS queue FROM new_events e
              WHERE e.type = 'Enqueued' AND e.data ->> 'status' = 'pending') x;
    RETURN NULL;
END $$;

-- name: bench_use_set_based
DROP TRIGGER events_project ON events;
CREATE TRIGGER events_project AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION bench_projection_set_based();

-- name: bench_rows_unlike_fold
-- Rows that differ from the fold of their own events (must be 0).
SELECT count(*)
  FROM jobs j,
       LATERAL (SELECT job_fold(e ORDER BY e.version) AS folded FROM events e WHERE e.stream_id = j.id) f
 WHERE f.folded IS DISTINCT FROM j

