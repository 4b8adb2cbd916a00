-- The event log: the only source of truth. Every other table is a projection of it.
CREATE TABLE events (
    position       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writing transaction's id: readers of the global log only read below
    -- pg_snapshot_xmin(pg_current_snapshot()) so a late-committing transaction
    -- holding a lower position can never be skipped.
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    stream_type    text        NOT NULL CHECK (stream_type IN ('job', 'workflow')),
    stream_id      uuid        NOT NULL,
    version        integer     NOT NULL CHECK (version > 0),
    type           text        NOT NULL,
    schema_version smallint    NOT NULL DEFAULT 1,
    data           jsonb       NOT NULL DEFAULT '{}',
    tags           jsonb       NOT NULL DEFAULT '{}',
    -- Denormalised so a workflow's whole history (its own stream and its steps'
    -- job streams) is one index range, and SSE can filter by workflow.
    workflow_id    uuid,
    occurred_at    timestamptz NOT NULL DEFAULT now(),
    actor          text        NOT NULL DEFAULT 'system',
    UNIQUE (stream_id, version)
);

CREATE INDEX events_xid_position ON events (xid, position);
CREATE INDEX events_workflow ON events (workflow_id, position) WHERE workflow_id IS NOT NULL;

-- Idempotency is enforced by the log itself: a second Enqueued/WorkflowSubmitted
-- with the same key conflicts here and is dropped by ON CONFLICT DO NOTHING,
-- which waits for a concurrent inserter to commit or abort (race-safe).
CREATE UNIQUE INDEX events_idempotency ON events (stream_type, (data ->> 'idempotency_key'))
    WHERE data ? 'idempotency_key';

-- Append-only, enforced by the database for every role, superusers included.
CREATE FUNCTION events_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();

-- LISTEN/NOTIFY only wakes readers; they always re-read the log.
CREATE FUNCTION events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('qforge_events', '');
    RETURN NULL;
END $$;

CREATE TRIGGER events_wake AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_notify();

-- The state machine, synced from app/events/states.py by `qforge migrate`.
-- from_status '' is "the stream does not exist yet".
CREATE TABLE state_transitions (
    machine     text NOT NULL,
    from_status text NOT NULL,
    event_type  text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (machine, from_status, event_type, to_status)
);
