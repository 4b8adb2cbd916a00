-- The log's own rules: append-only for every role, wake-ups for readers, and
-- the upcasters that turn old event shapes into the current ones on read.

-- Append-only, enforced by the database for every role, superusers included.
CREATE OR REPLACE FUNCTION events_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE OR REPLACE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();
CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();

-- LISTEN/NOTIFY only wakes readers; they always re-read the log.
CREATE OR REPLACE FUNCTION events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('qforge_events', '');
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER events_wake AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_notify();

-- Event schema evolution: old shapes are turned into the current one on read.
-- Failed v1 carried {"attempt","message"}; v2 names why: {"attempt","reason","error"}.
CREATE OR REPLACE FUNCTION event_upcast_failed_v1(e events) RETURNS events LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    e.data := (e.data - 'message')
        || jsonb_build_object('reason', coalesce(e.data ->> 'reason', 'error'),
                              'error', coalesce(e.data ->> 'error', e.data ->> 'message'));
    e.schema_version := 2;
    RETURN e;
END $$;

-- A plain SQL CASE, inlined by the planner: current events cost nothing.
CREATE OR REPLACE FUNCTION event_upcast(e events) RETURNS events LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN e.schema_version = 1 AND e.type = 'Failed'
                THEN event_upcast_failed_v1(e) ELSE e END
$$;
