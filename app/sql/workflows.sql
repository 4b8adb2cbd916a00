-- name: workflow_lock
-- Workflows are always locked before their step jobs, in id order: the one
-- lock order that keeps completions, cancels and timers from deadlocking, and
-- that makes two steps finishing at once unblock their dependent exactly once
-- (the second waits here, then its next statement sees the first's commit).
SELECT id, status, version FROM workflows WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE

-- name: workflow_submit
-- The WorkflowSubmitted event; a repeated idempotency_key is dropped (see
-- events_idempotency) and the caller returns the existing workflow.
INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id,
                    occurred_at, actor)
VALUES ('workflow', %(id)s, 1, 'WorkflowSubmitted', %(data)s::jsonb, %(tags)s::jsonb, %(id)s,
        coalesce(%(now)s::timestamptz, now()), %(actor)s)
ON CONFLICT (stream_type, (data ->> 'idempotency_key')) WHERE data ? 'idempotency_key'
DO NOTHING
RETURNING stream_id

-- name: workflow_by_idempotency_key
SELECT id FROM workflows WHERE idempotency_key = %(key)s

-- name: workflow_by_external_id
SELECT id FROM workflows WHERE external_id = %(external_id)s

-- name: workflow_get
SELECT * FROM workflows WHERE id = %(id)s

-- name: workflow_steps
SELECT * FROM jobs WHERE workflow_id = %(id)s ORDER BY created_at, step
