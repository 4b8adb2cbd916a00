-- The projection: the fold of the log into jobs, workflows and execution_tags.

-- The job fold: apply(state, event) -> state. No I/O but the state-machine lookup.
CREATE OR REPLACE FUNCTION job_apply(s jobs, e events) RETURNS jobs LANGUAGE plpgsql STABLE AS $$
DECLARE
    d jsonb := e.data;
BEGIN
    IF s.id IS NOT NULL AND s.id <> e.stream_id THEN
        RAISE EXCEPTION 'event % of stream % applied to job %', e.position, e.stream_id, s.id;
    END IF;
    s.status := state_next('job', s.status, e.type, d ->> 'status');
    s.version := e.version;
    s.updated_at := e.occurred_at;
    CASE e.type
    WHEN 'Enqueued' THEN
        s.id := e.stream_id;
        s.task := d ->> 'task';
        s.queue := d ->> 'queue';
        s.priority := (d ->> 'priority')::integer;
        s.attempts := 0;
        s.free_attempts := 0;
        s.max_retries := (d ->> 'max_retries')::integer;
        s.run_at := (d ->> 'run_at')::timestamptz;
        s.timeout_seconds := (d ->> 'timeout_seconds')::double precision;
        s.payload := coalesce(d -> 'payload', '{}');
        s.tags := e.tags;
        s.idempotency_key := d ->> 'idempotency_key';
        s.workflow_id := e.workflow_id;
        s.step := d ->> 'step';
        s.step_type := d ->> 'step_type';
        s.depends_on := d -> 'depends_on';
        s.condition := d -> 'when';
        s.on_failure := d ->> 'on_failure';
        s.sleep_seconds := (d ->> 'seconds')::double precision;
        s.created_at := e.occurred_at;
        IF s.status = 'waiting' THEN
            s.started_at := e.occurred_at;
        END IF;
    WHEN 'StepUnblocked' THEN
        s.payload := s.payload || jsonb_build_object('inputs', coalesce(d -> 'inputs', '{}'));
        IF d ? 'failed_step' THEN  -- a failure handler also gets the error itself
            s.payload := s.payload || jsonb_build_object('failed_step', d -> 'failed_step',
                                                         'error', d -> 'error');
        END IF;
        s.run_at := coalesce((d ->> 'run_at')::timestamptz, e.occurred_at);
        IF s.status = 'waiting' THEN
            s.started_at := e.occurred_at;
        END IF;
    WHEN 'Claimed' THEN
        s.attempts := (d ->> 'attempt')::integer;
        s.worker := d ->> 'worker';
        s.heartbeat_at := e.occurred_at;
        s.started_at := e.occurred_at;
    WHEN 'Heartbeat' THEN
        s.heartbeat_at := e.occurred_at;
    WHEN 'Succeeded' THEN
        s.result := d -> 'result';
        s.finished_at := e.occurred_at;
    WHEN 'Triggered' THEN
        s.result := coalesce(d -> 'payload', '{}');
        s.finished_at := e.occurred_at;
    WHEN 'Failed' THEN
        s.last_error := d ->> 'error';
        IF d ? 'result' THEN
            s.result := d -> 'result';
        END IF;
    WHEN 'Retried' THEN
        s.run_at := (d ->> 'run_at')::timestamptz;
        s.finished_at := NULL;
        IF coalesce((d ->> 'manual')::boolean, false) THEN
            s.free_attempts := s.attempts;
        END IF;
    WHEN 'Released' THEN
        s.free_attempts := s.free_attempts + 1;
        s.run_at := e.occurred_at;
    WHEN 'DeadLettered', 'Cancelled', 'Skipped' THEN
        s.finished_at := e.occurred_at;
        IF d ? 'error' THEN
            s.last_error := d ->> 'error';
        END IF;
    ELSE
        RAISE EXCEPTION 'the job fold has no rule for event type %', e.type USING ERRCODE = 'check_violation';
    END CASE;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION job_apply_all(s jobs, evs events[]) RETURNS jobs LANGUAGE plpgsql STABLE AS $$
DECLARE
    e events;
BEGIN
    FOREACH e IN ARRAY evs LOOP
        s := job_apply(s, e);
    END LOOP;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION workflow_apply(s workflows, e events) RETURNS workflows LANGUAGE plpgsql STABLE AS $$
DECLARE
    d jsonb := e.data;
BEGIN
    s.status := state_next('workflow', s.status, e.type, NULL);
    s.version := e.version;
    s.updated_at := e.occurred_at;
    CASE e.type
    WHEN 'WorkflowSubmitted' THEN
        s.id := e.stream_id;
        s.name := d ->> 'name';
        s.tags := e.tags;
        s.idempotency_key := d ->> 'idempotency_key';
        s.external_id := d ->> 'external_id';
        s.definition := d -> 'steps';
        s.created_at := e.occurred_at;
    WHEN 'WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled' THEN
        s.error := d ->> 'error';
        s.finished_at := e.occurred_at;
    ELSE
        RAISE EXCEPTION 'the workflow fold has no rule for event type %', e.type USING ERRCODE = 'check_violation';
    END CASE;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION workflow_apply_all(s workflows, evs events[]) RETURNS workflows
LANGUAGE plpgsql STABLE AS $$
DECLARE
    e events;
BEGIN
    FOREACH e IN ARRAY evs LOOP
        s := workflow_apply(s, e);
    END LOOP;
    RETURN s;
END $$;

-- Folds for replay and as-of reads: the same apply functions as the live path.
CREATE OR REPLACE AGGREGATE job_fold(events) (SFUNC = job_apply, STYPE = jobs);
CREATE OR REPLACE AGGREGATE workflow_fold(events) (SFUNC = workflow_apply, STYPE = workflows);

-- The live projection: every INSERT INTO events folds the new events of each
-- stream into its row, in the inserting statement, so the read model can never
-- lag or drift from the log.
-- The batches it folds are always small next to the jobs table, so every join
-- to jobs must be an index lookup per new event. The planner cannot see that: a
-- transition table is estimated at a fixed size and a fresh or fast-growing
-- jobs table has no statistics yet, and it picked a hash join over a seq scan
-- of jobs (O(table) per statement) for the UPDATE. Hash and merge joins are
-- therefore off inside this function.
CREATE OR REPLACE FUNCTION events_project() RETURNS trigger LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off AS $$
BEGIN
    WITH streams AS (
        SELECT e.stream_id, min(e.version) AS first_version,
               array_agg(event_upcast(e) ORDER BY e.version) AS evs
          FROM new_events e
         WHERE e.stream_type = 'job'
         GROUP BY e.stream_id
    ), created AS (
        INSERT INTO jobs
        SELECT n.* FROM streams st, LATERAL job_apply_all(NULL::jobs, st.evs) n
         WHERE st.first_version = 1
    )
    UPDATE jobs j
       SET (version, task, queue, status, priority, attempts, free_attempts, max_retries,
            run_at, timeout_seconds, payload, result, last_error, tags, idempotency_key,
            workflow_id, step, step_type, depends_on, condition, on_failure, sleep_seconds,
            worker, heartbeat_at, started_at, finished_at, created_at, updated_at)
         = (SELECT n.version, n.task, n.queue, n.status, n.priority, n.attempts,
                   n.free_attempts, n.max_retries, n.run_at, n.timeout_seconds, n.payload,
                   n.result, n.last_error, n.tags, n.idempotency_key, n.workflow_id, n.step,
                   n.step_type, n.depends_on, n.condition, n.on_failure, n.sleep_seconds,
                   n.worker, n.heartbeat_at, n.started_at, n.finished_at, n.created_at,
                   n.updated_at
              FROM job_apply_all(j, st.evs) n)
      FROM streams st
     WHERE j.id = st.stream_id AND st.first_version > 1;

    WITH streams AS (
        SELECT e.stream_id, min(e.version) AS first_version,
               array_agg(event_upcast(e) ORDER BY e.version) AS evs
          FROM new_events e
         WHERE e.stream_type = 'workflow'
         GROUP BY e.stream_id
    ), created AS (
        INSERT INTO workflows
        SELECT n.* FROM streams st, LATERAL workflow_apply_all(NULL::workflows, st.evs) n
         WHERE st.first_version = 1
    )
    UPDATE workflows w
       SET (version, name, status, tags, idempotency_key, external_id, definition, error,
            created_at, updated_at, finished_at)
         = (SELECT n.version, n.name, n.status, n.tags, n.idempotency_key, n.external_id,
                   n.definition, n.error, n.created_at, n.updated_at, n.finished_at
              FROM workflow_apply_all(w, st.evs) n)
      FROM streams st
     WHERE w.id = st.stream_id AND st.first_version > 1;

    -- Wake idle workers of the queues that just got claimable work. A new job
    -- names its queue in the event; the others need one primary-key probe
    -- each (LATERAL ... LIMIT 1: a plain join let the planner loop over every
    -- pending job for each event, seconds per 1,000-job enqueue).
    PERFORM pg_notify('qforge_jobs', x.queue)
       FROM (SELECT e.data ->> 'queue' AS queue
               FROM new_events e
              WHERE e.type = 'Enqueued' AND e.data ->> 'status' = 'pending'
             UNION
             SELECT j.queue
               FROM new_events e
              CROSS JOIN LATERAL (SELECT jobs.queue, jobs.status FROM jobs
                                   WHERE jobs.id = e.stream_id LIMIT 1) j
              WHERE e.type IN ('StepUnblocked', 'Retried', 'Released')
                AND j.status = 'pending') x;

    INSERT INTO execution_tags (key, value, kind, id)
    SELECT t.key, t.value, e.stream_type, e.stream_id
      FROM new_events e, LATERAL jsonb_each_text(e.tags) t
     WHERE e.version = 1 AND e.tags <> '{}'
    ON CONFLICT DO NOTHING;

    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER events_project AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION events_project();
