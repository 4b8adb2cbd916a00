-- name: job_enqueue
-- One Enqueued event per new job; events_project() creates the rows. A repeated
-- idempotency_key conflicts on events_idempotency and is dropped here (the
-- conflict check waits for a concurrent inserter, so two racing enqueues
-- produce one job).
INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id,
                    occurred_at, actor)
SELECT 'job', j.id, 1, 'Enqueued', j.data, coalesce(j.tags, '{}'), j.workflow_id,
       coalesce(%(now)s::timestamptz, now()), %(actor)s
  FROM jsonb_to_recordset(%(jobs)s::jsonb) AS j(id uuid, data jsonb, tags jsonb, workflow_id uuid)
ON CONFLICT (stream_type, (data ->> 'idempotency_key')) WHERE data ? 'idempotency_key'
DO NOTHING
RETURNING stream_id

-- name: job_ids_by_idempotency_key
SELECT id, idempotency_key FROM jobs WHERE idempotency_key = ANY(%(keys)s::text[])

-- name: job_claim
-- The claim is one statement. `picked` locks up to `limit` claimable rows per
-- queue with FOR UPDATE SKIP LOCKED, walking the partial claim index in its
-- own order (priority DESC, run_at, id), so concurrent claimers skip each
-- other's rows instead of waiting; the CTE is an optimisation fence that keeps
-- the LIMIT inside the index scan. The Claimed events are inserted in the same
-- statement, and events_project() folds them into the rows (status running,
-- attempts + 1) before it ends. Time is a parameter so tests control the clock.
WITH picked AS (
    SELECT c.*
      FROM unnest(%(queues)s::text[]) AS q(queue)
     CROSS JOIN LATERAL (
            SELECT j.id, j.version, j.attempts, j.tags, j.workflow_id, j.priority, j.run_at,
                   j.task, j.queue, j.payload, j.timeout_seconds, j.step
              FROM jobs j
             WHERE j.status = 'pending' AND j.queue = q.queue
               AND j.run_at <= coalesce(%(now)s::timestamptz, now())
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED) c
     ORDER BY c.priority DESC, c.run_at, c.id
     LIMIT %(limit)s
), claimed AS (
    INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id,
                        occurred_at, actor)
    SELECT 'job', p.id, p.version + 1, 'Claimed',
           jsonb_build_object('attempt', p.attempts + 1, 'worker', %(worker)s::text),
           p.tags, p.workflow_id, coalesce(%(now)s::timestamptz, now()), %(worker)s
      FROM picked p
    RETURNING stream_id
)
SELECT p.id, p.task, p.queue, p.payload, p.attempts + 1 AS attempt, p.timeout_seconds,
       p.workflow_id, p.step, p.tags
  FROM picked p JOIN claimed c ON c.stream_id = p.id

-- name: job_heartbeat
-- Fenced: only the current attempt of a running job may beat. Rows that do not
-- match are not returned, and the worker stops those tasks.
WITH report AS (
    SELECT * FROM jsonb_to_recordset(%(reports)s::jsonb) AS r(id uuid, attempt integer)
), target AS (
    SELECT j.id, j.version, j.tags, j.workflow_id, j.attempts
      FROM jobs j JOIN report r ON r.id = j.id AND r.attempt = j.attempts
     WHERE state_allows('job', j.status, 'Heartbeat')
     ORDER BY j.id
       FOR UPDATE OF j
)
INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id,
                    occurred_at, actor)
SELECT 'job', t.id, t.version + 1, 'Heartbeat',
       jsonb_build_object('attempt', t.attempts, 'worker', %(actor)s::text),
       t.tags, t.workflow_id, coalesce(%(now)s::timestamptz, now()), %(actor)s
  FROM target t
RETURNING stream_id AS id

-- name: job_complete
-- Fenced batch completion: a report for a superseded attempt, or for a job
-- that is no longer running, matches no row and changes nothing.
WITH report AS (
    SELECT * FROM jsonb_to_recordset(%(reports)s::jsonb) AS r(id uuid, attempt integer,
                                                               result jsonb)
), target AS (
    SELECT j.id, j.version, j.tags, j.workflow_id, j.attempts, r.result
      FROM jobs j JOIN report r ON r.id = j.id AND r.attempt = j.attempts
     WHERE j.attempts > 0 AND state_allows('job', j.status, 'Succeeded')
     ORDER BY j.id
       FOR UPDATE OF j
)
INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id,
                    occurred_at, actor)
SELECT 'job', t.id, t.version + 1, 'Succeeded',
       jsonb_build_object('attempt', t.attempts, 'result', t.result),
       t.tags, t.workflow_id, coalesce(%(now)s::timestamptz, now()), %(actor)s
  FROM target t
RETURNING stream_id AS id, workflow_id

-- name: job_fail
-- Fenced batch failure. Each failed attempt appends Failed and, in the same
-- statement, Retried (backoff min(base*2^(n-1), cap) plus jitter, n counting
-- only attempts that use the budget) or DeadLettered once n > max_retries.
-- This is the one place where a worker's job becomes dead.
WITH report AS (
    SELECT * FROM jsonb_to_recordset(%(reports)s::jsonb) AS r(id uuid, attempt integer,
                                                               reason text, error text,
                                                               result jsonb)
), target AS (
    SELECT j.id, j.version, j.tags, j.workflow_id, j.attempts, r.reason, r.error, r.result,
           j.attempts - j.free_attempts > j.max_retries AS exhausted,
           job_backoff_seconds(j.attempts - j.free_attempts, %(base)s, %(cap)s,
                               random() * %(jitter)s) AS delay
      FROM jobs j JOIN report r ON r.id = j.id AND r.attempt = j.attempts
     WHERE j.attempts > 0 AND state_allows('job', j.status, 'Failed')
     ORDER BY j.id
       FOR UPDATE OF j
)
INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, tags,
                    workflow_id, occurred_at, actor)
SELECT 'job', t.id, t.version + x.n, x.type, x.schema_version, x.data, t.tags,
       t.workflow_id, coalesce(%(now)s::timestamptz, now()), %(actor)s
  FROM target t
 CROSS JOIN LATERAL (VALUES
        (1, 'Failed', 2,
         jsonb_build_object('attempt', t.attempts, 'reason', coalesce(t.reason, 'error'),
                            'error', t.error)
         || CASE WHEN t.result IS NULL THEN '{}'::jsonb
                 ELSE jsonb_build_object('result', t.result) END),
        (2, CASE WHEN t.exhausted THEN 'DeadLettered' ELSE 'Retried' END, 1,
         CASE WHEN t.exhausted
              THEN jsonb_build_object('attempt', t.attempts, 'error', t.error)
              ELSE jsonb_build_object('attempt', t.attempts, 'delay_seconds', t.delay,
                                      'run_at', coalesce(%(now)s::timestamptz, now())
                                                + make_interval(secs => t.delay))
         END)
       ) AS x(n, type, schema_version, data)
RETURNING stream_id AS id, type, workflow_id, (data ->> 'run_at')::timestamptz AS retry_at

-- name: job_lock
-- Lock jobs (in id order, so two lockers cannot deadlock) to decide on them.
SELECT * FROM jobs WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE

-- name: job_get
SELECT * FROM jobs WHERE id = %(id)s

-- name: job_workflow_ids
SELECT DISTINCT workflow_id FROM jobs
 WHERE id = ANY(%(ids)s::uuid[]) AND workflow_id IS NOT NULL

-- name: job_stale
-- Running jobs whose worker stopped beating (the monitor fails them).
SELECT id, attempts AS attempt, worker, workflow_id FROM jobs
 WHERE status = 'running' AND heartbeat_at < %(cutoff)s
 ORDER BY heartbeat_at
 LIMIT %(limit)s

-- name: job_due_timers
-- Waiting steps whose time has come: a sleep ends, a trigger wait times out.
SELECT id, step_type, workflow_id, sleep_seconds FROM jobs
 WHERE status = 'waiting' AND run_at <= coalesce(%(now)s::timestamptz, now())
 ORDER BY run_at
 LIMIT %(limit)s
