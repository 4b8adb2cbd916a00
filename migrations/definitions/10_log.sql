-- The log's own rules: append-only for every role, wake-ups for readers, the
-- hash of an event, and the upcasters that turn old shapes into current ones.

-- Append-only, enforced by the database for every role, superusers included.
-- The row triggers on the partitioned table reach every partition; TRUNCATE
-- triggers are per table, so log_guard_partition() adds one to each partition.
-- (Other append-only tables name themselves in the trigger's argument.)
CREATE OR REPLACE FUNCTION events_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', coalesce(TG_ARGV[0], 'events'), TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE OR REPLACE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_refuse_change();
CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();

-- (`log`: events, or events_packed for a packed partition, migration 0019.)
DROP FUNCTION IF EXISTS log_guard_partition(regclass);
CREATE OR REPLACE FUNCTION log_guard_partition(partition regclass, log text DEFAULT 'events') RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF log = 'events' THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change()', partition);
    ELSE
        EXECUTE format('CREATE OR REPLACE TRIGGER events_packed_no_truncate BEFORE TRUNCATE ON %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change(%L)', partition, log);
    END IF;
END $$;

SELECT log_guard_partition(inhrelid::regclass) FROM pg_inherits WHERE inhparent = 'events'::regclass;

-- The readers' wake-up (NOTIFY qforge_events) is sent by events_project()
-- (30_fold.sql), once its own statement trigger: each costs every append a
-- call (issue 33).
DROP TRIGGER IF EXISTS events_wake ON events;
DROP FUNCTION IF EXISTS events_notify();

-- The head of a stream's hash chain: the last hash, kept on the stream's
-- projection row (each stream type has its own table; a stream with no row
-- yet starts its chain empty). One probe of that table's key, inlined into
-- the appending statement; a stream type with a projection row of its own is
-- named here once, and every append chains through it.
CREATE OR REPLACE FUNCTION stream_head(stream_type text, stream_id uuid)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE stream_type
        WHEN 'job' THEN (SELECT j.chain FROM jobs j WHERE j.id = stream_id)
        WHEN 'workflow' THEN (SELECT w.chain FROM workflows w WHERE w.id = stream_id)
        WHEN 'schedule' THEN (SELECT s.chain FROM schedules s WHERE s.id = stream_id)
        WHEN 'queue' THEN (SELECT qs.chain FROM queue_settings qs WHERE qs.id = stream_id)
        WHEN 'key' THEN (SELECT ks.chain FROM key_settings ks WHERE ks.id = stream_id)
        WHEN 'token' THEN (SELECT t.chain FROM tokens t WHERE t.id = stream_id)
        WHEN 'definition' THEN (SELECT d.chain FROM definitions d WHERE d.id = stream_id)
    END
$$;

-- An event's hash: SHA-256 of the previous hash of its stream (empty for the
-- first event) and its canonical encoding (event_canonical_v1, migration 0006).
-- Appends compute it in the statement that writes the event, from the head of
-- the chain kept on the stream's row, which that statement has locked.
--
-- The encoding is written here in three parts, the same bytes as 0006's:
-- "QFE1", the stream id and the version; the part every event of one append
-- shares (schema version, time, stream type, type, actor:
-- event_canonical_v1_fixed); the workflow id, tags and data. An append of many
-- events of one kind computes the shared part once, as an InitPlan
-- (`(SELECT event_canonical_v1_fixed(...))`), and hashes each event with
-- event_hash_fixed: about a third of the hash's cost per event (a dozen
-- concatenations and sends) is then paid once per statement.
CREATE OR REPLACE FUNCTION event_canonical_v1_fixed(schema_version smallint, occurred_at timestamptz,
                                                    stream_type text, type text, actor text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT int2send(schema_version) || timestamptz_send(occurred_at)
           || int4send(octet_length(stream_type)) || textsend(stream_type)
           || int4send(octet_length(type)) || textsend(type)
           || int4send(octet_length(actor)) || textsend(actor)
$$;

CREATE OR REPLACE FUNCTION event_canonical_v1_tail(workflow_id uuid, tags jsonb, data jsonb)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN workflow_id IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || uuid_send(workflow_id) END
           || CASE WHEN tags IS NULL THEN '\xffffffff'::bytea
                   ELSE int4send(octet_length(tags::text)) || textsend(tags::text) END
           || textsend(data::text)
$$;

CREATE OR REPLACE FUNCTION event_canonical_v1(stream_type text, stream_id uuid, version integer, type text,
                                              schema_version smallint, data jsonb, tags jsonb, workflow_id uuid,
                                              occurred_at timestamptz, actor text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '\x51464531'::bytea || uuid_send(stream_id) || int4send(version)
           || event_canonical_v1_fixed(schema_version, occurred_at, stream_type, type, actor)
           || event_canonical_v1_tail(workflow_id, tags, data)
$$;

-- `fixed` is event_canonical_v1_fixed(...) of this event.
CREATE OR REPLACE FUNCTION event_hash_fixed(prev bytea, stream_id uuid, version integer, fixed bytea,
                                            workflow_id uuid, tags jsonb, data jsonb)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT sha256(coalesce(prev, ''::bytea) || '\x51464531'::bytea || uuid_send(stream_id) || int4send(version)
                  || fixed || event_canonical_v1_tail(workflow_id, tags, data))
$$;

CREATE OR REPLACE FUNCTION event_hash(prev bytea, stream_type text, stream_id uuid, version integer,
                                      type text, schema_version smallint, data jsonb, tags jsonb,
                                      workflow_id uuid, occurred_at timestamptz, actor text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT event_hash_fixed(prev, stream_id, version,
                            event_canonical_v1_fixed(schema_version, occurred_at, stream_type, type, actor),
                            workflow_id, tags, data)
$$;

-- Event schema evolution: old shapes are turned into the current one on read
-- (the Python twins are qforge.events.types.UPCASTERS; a test keeps them equal).
-- Failed v1 carried {"attempt","message"}; v2 names why: {"attempt","reason","error"}.
-- (STABLE, as jsonb_build_object is: an IMMUTABLE label would keep the
-- planner from inlining it.)
CREATE OR REPLACE FUNCTION event_upcast_data(type text, schema_version smallint, data jsonb)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN schema_version = 1 AND type = 'Failed'
                THEN (data - 'message') || jsonb_build_object(
                         'reason', coalesce(data ->> 'reason', 'error'),
                         'error', coalesce(data ->> 'error', data ->> 'message'))
                -- the secret's digest that TokenCreated carried before 0021: never served
                WHEN type = 'TokenCreated' THEN data - 'sha256'
                ELSE data END
$$;

CREATE OR REPLACE FUNCTION event_upcast_version(type text, schema_version smallint)
RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN schema_version = 1 AND type = 'Failed' THEN 2::smallint ELSE schema_version END
$$;

-- What readers see: the current shape (upcast) with every field the writer
-- left at its default written out, as the API has always shown events. Stored
-- events stay compact (and hashed as stored); qforge.events.types.expand is
-- the Python twin, and a test keeps them equal.
CREATE OR REPLACE FUNCTION event_read_data(type text, schema_version smallint, data jsonb, actor text,
                                           occurred_at timestamptz)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE type
        WHEN 'Enqueued' THEN jsonb_build_object(
                 'queue', 'default', 'priority', 0, 'max_retries', 3, 'payload', '{}'::jsonb,
                 'status', 'pending',
                 'run_at', to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
             || event_upcast_data(type, schema_version, data)
        WHEN 'Claimed' THEN jsonb_build_object('worker', actor) || event_upcast_data(type, schema_version, data)
        WHEN 'Heartbeat' THEN jsonb_build_object('worker', actor) || event_upcast_data(type, schema_version, data)
        WHEN 'Succeeded' THEN jsonb_build_object('result', NULL) || event_upcast_data(type, schema_version, data)
        ELSE event_upcast_data(type, schema_version, data)
    END
$$;
