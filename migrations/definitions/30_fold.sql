-- The projection: how a set of events changes the read model (jobs, workflows,
-- execution_tags). events_project() is the one definition: a statement trigger
-- that folds the statement's new events. The log carries it (every append is
-- folded in the appending statement), and so does each replay's feed table
-- (qforge replay inserts the log into it, chunk by chunk, with the scratch
-- tables first on the search path), so live and replay cannot drift. Two
-- hot statements fold their own job events with the same rules written for
-- one event type (the claim's Claimed, the completion's Succeeded: jobs_folded
-- below); replay folds those events here, and the oracle tests hold the two
-- to the same rows.
-- It is the log's only trigger after INSERT (issue 33: each statement trigger
-- costs every append a call, and the job's path is most of them): the rare
-- streams' folds (definitions_fold, flow_fold, tokens_fold) are called from
-- here with those events, when a statement has some, and on the log (not a
-- replay's feed) it wakes the readers (NOTIFY qforge_events: they re-read
-- the log).
--
-- It is set-based: one INSERT creates every new stream of the set, then one
-- UPDATE per round applies, to every stream at once, the event whose version
-- follows the row's (`e.version = row.version + 1`). A set with one event per
-- stream (a claim, a batch of completions) is one round; a failure (Failed then
-- Retried) two. Each column's rule is written once, below, per event type.
-- Every event must apply: one that does not follow its stream's version (a
-- concurrent writer appended the same version first, or the stream does not
-- exist) fails the statement that appended it, as does a transition the state
-- machine does not allow.
--
-- What each event type changes: every event sets version, updated_at,
-- last_position and chain, and status by the state machine (state_target, from
-- app/events/states.py); besides those, the columns below. A new event type is
-- added here, in its table and in the rules it names, and tests/test_fold_table.py
-- checks these tables against the state machine's event types and against the
-- rules of the two UPDATEs (a rule that names an event the table does not list
-- for its column, or the other way round, fails it).
--
-- job event       sets
-- --------------  ----------------------------------------------------------
-- Enqueued        the new row (INSERT INTO jobs below)
-- Claimed         attempts, worker, heartbeat_at, started_at
-- Heartbeat       heartbeat_at
-- Succeeded       result, finished_at
-- Failed          result (when the report has one), last_error
-- Retried         free_attempts (when manual), run_at, finished_at
-- DeadLettered    last_error (when given), finished_at
-- Released        free_attempts, run_at
-- Cancelled       last_error (when given), finished_at
-- Skipped         last_error (when given), finished_at
-- Triggered       result, finished_at
-- StepUnblocked   run_at, payload, started_at (when it starts waiting)
-- StepReopened    free_attempts, run_at, result, last_error, started_at, finished_at
--
-- workflow event     sets
-- -----------------  -------------------------------------------------------
-- WorkflowSubmitted  the new row (INSERT INTO workflows below)
-- WorkflowSucceeded  error, finished_at, result
-- WorkflowFailed     error, finished_at
-- WorkflowCancelled  error, finished_at
-- WorkflowResumed    error, finished_at, result, deadline_at

-- A round of the fold's UPDATEs (below) applied `done` more events of a stream type,
-- `applied` before it, `expected` in all: how many now. A round that applies
-- none while some are left means they do not follow their stream's version.
CREATE OR REPLACE FUNCTION events_project_round(p_stream_type text, p_applied bigint, p_done bigint,
                                                p_expected bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF p_done = 0 AND p_applied < p_expected THEN
        RAISE EXCEPTION '% events out of order: % of % did not follow their stream''s version'
                        ' (a concurrent append of the same version, or an unknown stream)',
                        p_stream_type, p_expected - p_applied, p_expected USING ERRCODE = 'unique_violation';
    END IF;
    RETURN p_applied + p_done;
END $$;

-- The claim's and the completion's hot paths (job_claim_plain, job_complete in
-- app/sql/jobs.sql) fold their own events in their own statement: the rows they
-- lock, with the rules of one event type (below, in
-- the job UPDATE, the same rules for every type). Such a statement says so with
-- jobs_folded(expected, applied): it fails the statement unless every event was
-- applied, then leaves for events_project() (at the end of that statement) the
-- transaction-local setting qforge.folded = '<events>:<statement time>', which
-- events_project() reads and clears. It then skips the job UPDATE for exactly
-- that statement's events (a count that differs fails it, as a stale setting
-- would). The oracle tests hold both ways of folding to the same rows (replay
-- folds every event the general way). A role that can append events can also
-- write the jobs it folds (90_roles.sql), so the setting grants nothing new;
-- `qforge replay --verify` finds a row that differs from the log.
CREATE OR REPLACE FUNCTION jobs_folded(p_expected bigint, p_applied bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_applied <> p_expected THEN
        RAISE EXCEPTION 'job events out of order: % of % were not applied to their jobs'
                        ' (a concurrent change of the same job)', p_expected - p_applied, p_expected
            USING ERRCODE = 'unique_violation';
    END IF;
    PERFORM set_config('qforge.folded', p_expected || ':' || statement_timestamp(), true);
    RETURN true;
END $$;

-- The sets folded here are small next to the tables they update: every join
-- must be an index lookup per event. The planner cannot know the size of a
-- transition table, and once picked a hash join over a scan of jobs. So the
-- UPDATEs below match a row to its event by `= ANY (ARRAY[...])`, which can
-- be a probe of the key per event but neither a hash nor a merge join: the
-- plans that SET enable_hashjoin = off SET enable_mergejoin = off on this
-- function left, without the SET clauses, which cost each call of the
-- function (about 5 % of a one-job claim's or completion's PostgreSQL CPU,
-- issue 33).
CREATE OR REPLACE FUNCTION events_project() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    new_jobs bigint;
    expected_jobs bigint;
    new_workflows bigint;
    expected_workflows bigint;
    tagged bigint;
    rare bigint;
    others events[];
    applied bigint;
    done bigint;
    folded text := current_setting('qforge.folded', true);
BEGIN
    IF folded <> '' THEN  -- (NULL: never set in this session)
        PERFORM set_config('qforge.folded', '', true);
    END IF;
    -- One pass over the set tells which statements have work to do.
    SELECT count(*) FILTER (WHERE e.stream_type = 'job' AND e.version = 1),
           count(*) FILTER (WHERE e.stream_type = 'job' AND e.version > 1),
           count(*) FILTER (WHERE e.stream_type = 'workflow' AND e.version = 1),
           count(*) FILTER (WHERE e.stream_type = 'workflow' AND e.version > 1),
           count(*) FILTER (WHERE e.version = 1 AND e.tags IS NOT NULL AND e.tags <> '{}'),
           count(*) FILTER (WHERE e.stream_type NOT IN ('job', 'workflow'))
      INTO new_jobs, expected_jobs, new_workflows, expected_workflows, tagged, rare
      FROM new_events e;

    -- New jobs: an Enqueued event creates the row.
    IF new_jobs > 0 THEN
    INSERT INTO jobs (id, version, task, queue, status, priority, attempts, free_attempts, max_retries,
                      run_at, timeout_seconds, payload, result, last_error, tags, idempotency_key,
                      workflow_id, step, step_type, depends_on, condition, on_failure, sleep_seconds,
                      worker, heartbeat_at, started_at, finished_at, created_at, updated_at,
                      last_position, chain, concurrency_key, concurrency_limit, fairness_key, trace,
                      element_of, element_index, backoff_base_seconds, backoff_cap_seconds)
    SELECT e.stream_id, e.version, e.d ->> 'task', coalesce(e.d ->> 'queue', 'default'), s.status,
           coalesce((e.d ->> 'priority')::integer, 0), 0, 0, coalesce((e.d ->> 'max_retries')::integer, 3),
           coalesce((e.d ->> 'run_at')::timestamptz, e.occurred_at), (e.d ->> 'timeout_seconds')::float8,
           coalesce(e.d -> 'payload', '{}'), NULL, NULL, coalesce(e.tags, '{}'), e.d ->> 'idempotency_key',
           e.workflow_id, e.d ->> 'step', e.d ->> 'step_type', e.d -> 'depends_on', e.d -> 'when',
           e.d ->> 'on_failure', (e.d ->> 'seconds')::float8,
           NULL, NULL, CASE WHEN s.status = 'waiting' THEN e.occurred_at END, NULL,
           e.occurred_at, e.occurred_at, e.position, e.hash,
           e.d ->> 'concurrency_key', (e.d ->> 'concurrency_limit')::integer, e.d ->> 'fairness_key', e.d -> 'trace',
           e.d ->> 'element_of', (e.d ->> 'element_index')::integer,
           (e.d ->> 'backoff_base_seconds')::float8, (e.d ->> 'backoff_cap_seconds')::float8
      FROM (SELECT x.*, event_upcast_data(x.type, x.schema_version, x.data) AS d
              FROM new_events x
             WHERE x.stream_type = 'job' AND x.version = 1
            OFFSET 0) e  -- a fence: d is computed once per event, not once per use
     CROSS JOIN LATERAL (SELECT coalesce(
                state_target('job', NULL, e.type, coalesce(e.d ->> 'status', 'pending')),
                state_refuse('job', NULL, e.type, e.d ->> 'status', e.stream_id)) AS status) s;
    END IF;

    applied := 0;
    IF folded <> '' AND expected_jobs > 0 THEN  -- the appending statement applied them (jobs_folded)
        IF folded <> expected_jobs || ':' || statement_timestamp() THEN
            RAISE EXCEPTION 'job events folded by their statement: %, but this statement appended % (%)',
                            folded, expected_jobs, statement_timestamp() USING ERRCODE = 'internal_error';
        END IF;
        applied := expected_jobs;
    END IF;
    WHILE applied < expected_jobs LOOP
        UPDATE jobs j SET
            version = e.version, updated_at = e.occurred_at, last_position = e.position, chain = e.hash,
            status = coalesce(state_target('job', j.status, e.type, e.d ->> 'status'),
                              state_refuse('job', j.status, e.type, e.d ->> 'status', e.stream_id)),
            -- every claim bumps attempts: the fencing token of later reports
            attempts = CASE WHEN e.type = 'Claimed' THEN (e.d ->> 'attempt')::integer ELSE j.attempts END,
            -- attempts that do not count against max_retries: handed back by a
            -- stopping worker, or spent before an operator's retry
            free_attempts = CASE
                WHEN e.type = 'Released' THEN j.free_attempts + 1
                WHEN e.type = 'Retried' AND coalesce((e.d ->> 'manual')::boolean, false) THEN j.attempts
                WHEN e.type = 'StepReopened' THEN j.attempts
                ELSE j.free_attempts END,
            run_at = CASE e.type
                WHEN 'StepUnblocked' THEN coalesce((e.d ->> 'run_at')::timestamptz, e.occurred_at)
                WHEN 'Retried' THEN (e.d ->> 'run_at')::timestamptz
                WHEN 'Released' THEN e.occurred_at
                WHEN 'StepReopened' THEN coalesce((e.d ->> 'run_at')::timestamptz, e.occurred_at)
                ELSE j.run_at END,
            -- an unblocked step receives its dependencies' outputs; a failure
            -- handler also the error of the step it handles
            payload = CASE WHEN e.type = 'StepUnblocked'
                THEN j.payload || jsonb_build_object('inputs', coalesce(e.d -> 'inputs', '{}'))
                     || CASE WHEN e.d ? 'failed_step'
                             THEN jsonb_build_object('failed_step', e.d -> 'failed_step', 'error', e.d -> 'error')
                             ELSE '{}'::jsonb END
                ELSE j.payload END,
            result = CASE e.type
                WHEN 'Succeeded' THEN coalesce(e.d -> 'result', 'null'::jsonb)
                WHEN 'Triggered' THEN coalesce(e.d -> 'payload', '{}'::jsonb)
                WHEN 'Failed' THEN coalesce(e.d -> 'result', j.result)
                WHEN 'StepReopened' THEN NULL
                ELSE j.result END,
            last_error = CASE
                WHEN e.type = 'Failed' THEN e.d ->> 'error'
                WHEN e.type IN ('DeadLettered', 'Cancelled', 'Skipped') AND e.d ? 'error' THEN e.d ->> 'error'
                WHEN e.type = 'StepReopened' THEN NULL
                ELSE j.last_error END,
            worker = CASE WHEN e.type = 'Claimed' THEN coalesce(e.d ->> 'worker', e.actor) ELSE j.worker END,
            heartbeat_at = CASE WHEN e.type IN ('Claimed', 'Heartbeat') THEN e.occurred_at
                                ELSE j.heartbeat_at END,
            -- a wait step's start is when the wait began
            started_at = CASE
                WHEN e.type = 'Claimed' THEN e.occurred_at
                WHEN e.type IN ('StepUnblocked', 'StepReopened') AND e.d ->> 'status' = 'waiting'
                    THEN e.occurred_at
                WHEN e.type = 'StepReopened' THEN NULL
                ELSE j.started_at END,
            finished_at = CASE
                WHEN e.type IN ('Succeeded', 'Triggered', 'DeadLettered', 'Cancelled', 'Skipped')
                    THEN e.occurred_at
                WHEN e.type IN ('Retried', 'StepReopened') THEN NULL
                ELSE j.finished_at END
          FROM (SELECT x.*, event_upcast_data(x.type, x.schema_version, x.data) AS d
                  FROM new_events x
                 WHERE x.stream_type = 'job' AND x.version > 1
                OFFSET 0) e
         WHERE j.id = ANY (ARRAY[e.stream_id]) AND j.version = ANY (ARRAY[e.version - 1]);
        GET DIAGNOSTICS done = ROW_COUNT;
        applied := events_project_round('job', applied, done, expected_jobs);
    END LOOP;

    -- New workflows, then the later events of workflows.
    IF new_workflows > 0 THEN
    INSERT INTO workflows (id, version, name, status, tags, idempotency_key, external_id, definition,
                           error, created_at, updated_at, finished_at, last_position, chain,
                           result_from, result, deadline_seconds, deadline_at,
                           definition_name, definition_version, parent_workflow_id, parent_job_id,
                           parent_step, nesting, code, input)
    SELECT e.stream_id, e.version, e.data ->> 'name',
           coalesce(state_target('workflow', NULL, e.type, NULL),
                    state_refuse('workflow', NULL, e.type, NULL, e.stream_id)),
           coalesce(e.tags, '{}'), e.data ->> 'idempotency_key', e.data ->> 'external_id',
           e.data -> 'steps', NULL, e.occurred_at, e.occurred_at, NULL, e.position, e.hash,
           e.data -> 'result', NULL, (e.data ->> 'deadline_seconds')::float8,
           (e.data ->> 'deadline_at')::timestamptz,
           e.data -> 'definition' ->> 'name', (e.data -> 'definition' ->> 'version')::integer,
           (e.data -> 'parent' ->> 'workflow_id')::uuid, (e.data -> 'parent' ->> 'job_id')::uuid,
           e.data -> 'parent' ->> 'step', (e.data -> 'parent' ->> 'depth')::integer,
           e.data ->> 'code', e.data -> 'input'
      FROM new_events e
     WHERE e.stream_type = 'workflow' AND e.version = 1;
    END IF;

    applied := 0;
    WHILE applied < expected_workflows LOOP
        UPDATE workflows w SET
            version = e.version, updated_at = e.occurred_at, last_position = e.position, chain = e.hash,
            status = coalesce(state_target('workflow', w.status, e.type, NULL),
                              state_refuse('workflow', w.status, e.type, NULL, e.stream_id)),
            -- a resumed workflow runs again: no error, no end, no result yet
            error = CASE WHEN e.type IN ('WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled',
                                         'WorkflowResumed')
                         THEN e.data ->> 'error' ELSE w.error END,
            finished_at = CASE WHEN e.type IN ('WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled')
                               THEN e.occurred_at
                               WHEN e.type = 'WorkflowResumed' THEN NULL
                               ELSE w.finished_at END,
            result = CASE e.type WHEN 'WorkflowSucceeded' THEN e.data -> 'result'
                                 WHEN 'WorkflowResumed' THEN NULL
                                 ELSE w.result END,
            deadline_at = CASE WHEN e.type = 'WorkflowResumed'
                               THEN coalesce((e.data ->> 'deadline_at')::timestamptz, w.deadline_at)
                               ELSE w.deadline_at END
          FROM new_events e
         WHERE e.stream_type = 'workflow' AND e.version > 1
           AND w.id = ANY (ARRAY[e.stream_id]) AND w.version = ANY (ARRAY[e.version - 1]);
        GET DIAGNOSTICS done = ROW_COUNT;
        applied := events_project_round('workflow', applied, done, expected_workflows);
    END LOOP;

    -- Tags never change after creation, so tag search is an insert-only table.
    IF tagged > 0 THEN
        INSERT INTO execution_tags (key, value, kind, id)
        SELECT t.key, t.value, e.stream_type, e.stream_id
          FROM new_events e, LATERAL jsonb_each_text(e.tags) t
         WHERE e.version = 1 AND e.tags IS NOT NULL AND e.tags <> '{}'
        ON CONFLICT DO NOTHING;
    END IF;

    -- The rare streams, in the order their own triggers once ran in (by name).
    IF rare > 0 THEN
        SELECT array_agg(ROW(e.*)::events ORDER BY e.position) INTO others
          FROM new_events e WHERE e.stream_type NOT IN ('job', 'workflow');
        PERFORM definitions_fold(others);
        PERFORM flow_fold(others);
        PERFORM tokens_fold(others);
    END IF;
    IF TG_TABLE_NAME = 'events' THEN
        PERFORM pg_notify('qforge_events', '');
    END IF;
    RETURN NULL;
END $$;

-- The live projection: every INSERT INTO events folds its events in the
-- inserting statement, so the read model can never lag or drift from the log.
SELECT events_fold_with('events_project', 'events_project');
