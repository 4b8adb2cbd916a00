-- The test oracle: the fold as it was written before it became set-based, one
-- event at a time in PL/pgSQL (0.1.0's job_apply/workflow_apply), kept in step
-- with the event schema since. Installed only into test databases; the live
-- path and replay use events_project (migrations/definitions/30_fold.sql), and
-- the property tests (tests/test_fold.py, test_core_properties.py,
-- test_replay_workload.py) check that the two agree.
--
-- Its rules repeat those of 0.1.0's job_apply in migrations/0002_projections.sql
-- (a released migration, never edited; 0006 dropped the functions), and that is
-- the point: an oracle written by event type, a row at a time, that shares no
-- code with the set-based fold it checks (organised by column), so that a
-- mistake in one is not in the other. Do not make the two share code.

-- What every event does to its stream's row (of jobs or workflows): the status
-- the state machine says, and the stream's position.
CREATE OR REPLACE FUNCTION oracle_every_event(e events, machine text, from_status text, wanted text,
                                              OUT status text, OUT id uuid, OUT version integer,
                                              OUT updated_at timestamptz, OUT last_position bigint,
                                              OUT chain bytea)
LANGUAGE sql AS $$
    SELECT coalesce(state_target(machine, from_status, e.type, wanted),
                    state_refuse(machine, from_status, e.type, wanted, e.stream_id)),
           e.stream_id, e.version, e.occurred_at, e.position, e.hash
$$;

CREATE OR REPLACE FUNCTION oracle_job_apply(s jobs, e events) RETURNS jobs LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := event_upcast_data(e.type, e.schema_version, e.data);
    wanted text := d ->> 'status';
BEGIN
    IF s.id IS NOT NULL AND s.id <> e.stream_id THEN
        RAISE EXCEPTION 'event % of stream % applied to job %', e.position, e.stream_id, s.id;
    END IF;
    IF e.type = 'Enqueued' THEN
        wanted := coalesce(wanted, 'pending');
    END IF;
    SELECT * INTO s.status, s.id, s.version, s.updated_at, s.last_position, s.chain
      FROM oracle_every_event(e, 'job', s.status, wanted);
    CASE e.type
    WHEN 'Enqueued' THEN
        s.task := d ->> 'task';
        s.queue := coalesce(d ->> 'queue', 'default');
        s.priority := coalesce((d ->> 'priority')::integer, 0);
        s.attempts := 0;
        s.free_attempts := 0;
        s.max_retries := coalesce((d ->> 'max_retries')::integer, 3);
        s.run_at := coalesce((d ->> 'run_at')::timestamptz, e.occurred_at);
        s.timeout_seconds := (d ->> 'timeout_seconds')::double precision;
        s.payload := coalesce(d -> 'payload', '{}');
        s.tags := coalesce(e.tags, '{}');
        s.idempotency_key := d ->> 'idempotency_key';
        s.workflow_id := e.workflow_id;
        s.step := d ->> 'step';
        s.step_type := d ->> 'step_type';
        s.depends_on := d -> 'depends_on';
        s.condition := d -> 'when';
        s.on_failure := d ->> 'on_failure';
        s.sleep_seconds := (d ->> 'seconds')::double precision;
        s.concurrency_key := d ->> 'concurrency_key';
        s.concurrency_limit := (d ->> 'concurrency_limit')::integer;
        s.fairness_key := d ->> 'fairness_key';
        s.trace := d -> 'trace';
        s.element_of := d ->> 'element_of';
        s.element_index := (d ->> 'element_index')::integer;
        s.backoff_base_seconds := (d ->> 'backoff_base_seconds')::double precision;
        s.backoff_cap_seconds := (d ->> 'backoff_cap_seconds')::double precision;
        s.created_at := e.occurred_at;
        IF s.status = 'waiting' THEN
            s.started_at := e.occurred_at;
        END IF;
    WHEN 'StepUnblocked' THEN
        s.payload := s.payload || jsonb_build_object('inputs', coalesce(d -> 'inputs', '{}'));
        IF d ? 'failed_step' THEN
            s.payload := s.payload || jsonb_build_object('failed_step', d -> 'failed_step',
                                                         'error', d -> 'error');
        END IF;
        s.run_at := coalesce((d ->> 'run_at')::timestamptz, e.occurred_at);
        IF s.status = 'waiting' THEN
            s.started_at := e.occurred_at;
        END IF;
    WHEN 'Claimed' THEN
        s.attempts := (d ->> 'attempt')::integer;
        s.worker := coalesce(d ->> 'worker', e.actor);
        s.heartbeat_at := e.occurred_at;
        s.started_at := e.occurred_at;
    WHEN 'Heartbeat' THEN
        s.heartbeat_at := e.occurred_at;
    WHEN 'Succeeded' THEN
        s.result := coalesce(d -> 'result', 'null');
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
    WHEN 'StepReopened' THEN
        s.free_attempts := s.attempts;
        s.run_at := coalesce((d ->> 'run_at')::timestamptz, e.occurred_at);
        s.result := NULL;
        s.last_error := NULL;
        s.started_at := CASE WHEN s.status = 'waiting' THEN e.occurred_at END;
        s.finished_at := NULL;
    WHEN 'DeadLettered', 'Cancelled', 'Skipped' THEN
        s.finished_at := e.occurred_at;
        IF d ? 'error' THEN
            s.last_error := d ->> 'error';
        END IF;
    ELSE
        RAISE EXCEPTION 'the oracle has no rule for event type %', e.type;
    END CASE;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION oracle_workflow_apply(s workflows, e events) RETURNS workflows
LANGUAGE plpgsql AS $$
BEGIN
    SELECT * INTO s.status, s.id, s.version, s.updated_at, s.last_position, s.chain
      FROM oracle_every_event(e, 'workflow', s.status, NULL);
    CASE e.type
    WHEN 'WorkflowSubmitted' THEN
        s.name := e.data ->> 'name';
        s.tags := coalesce(e.tags, '{}');
        s.idempotency_key := e.data ->> 'idempotency_key';
        s.external_id := e.data ->> 'external_id';
        s.definition := e.data -> 'steps';
        s.created_at := e.occurred_at;
        s.result_from := e.data -> 'result';
        s.deadline_seconds := (e.data ->> 'deadline_seconds')::double precision;
        s.deadline_at := (e.data ->> 'deadline_at')::timestamptz;
        s.definition_name := e.data -> 'definition' ->> 'name';
        s.definition_version := (e.data -> 'definition' ->> 'version')::integer;
        s.parent_workflow_id := (e.data -> 'parent' ->> 'workflow_id')::uuid;
        s.parent_job_id := (e.data -> 'parent' ->> 'job_id')::uuid;
        s.parent_step := e.data -> 'parent' ->> 'step';
        s.nesting := (e.data -> 'parent' ->> 'depth')::integer;
        s.code := e.data ->> 'code';
        s.input := e.data -> 'input';
    WHEN 'WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled' THEN
        s.error := e.data ->> 'error';
        s.finished_at := e.occurred_at;
        IF e.type = 'WorkflowSucceeded' THEN
            s.result := e.data -> 'result';
        END IF;
    WHEN 'WorkflowResumed' THEN
        s.error := NULL;
        s.finished_at := NULL;
        s.result := NULL;
        s.deadline_at := coalesce((e.data ->> 'deadline_at')::timestamptz, s.deadline_at);
    ELSE
        RAISE EXCEPTION 'the oracle has no rule for event type %', e.type;
    END CASE;
    RETURN s;
END $$;

CREATE OR REPLACE AGGREGATE oracle_job_fold(events) (SFUNC = oracle_job_apply, STYPE = jobs);
CREATE OR REPLACE AGGREGATE oracle_workflow_fold(events) (SFUNC = oracle_workflow_apply, STYPE = workflows);
