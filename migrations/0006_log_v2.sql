-- The log, second form: partitioned by position, every event hash-chained to
-- the one before it in its stream, idempotency keys in a table of their own,
-- and counters of jobs by queue and status. Existing events are copied, data
-- untouched, and given their hashes; the read model gets the columns the new
-- fold keeps (the stream's last position and the head of its hash chain).

-- 1. What was typed on the old table's row type goes first; the definitions
--    (applied after this file) create the new fold, upcaster and triggers.
DROP TRIGGER IF EXISTS events_project ON events;
DROP TRIGGER IF EXISTS events_wake ON events;
DROP TRIGGER IF EXISTS events_no_update_delete ON events;
DROP TRIGGER IF EXISTS events_no_truncate ON events;
DROP FUNCTION IF EXISTS events_project();
DROP AGGREGATE IF EXISTS job_fold(events);
DROP AGGREGATE IF EXISTS workflow_fold(events);
DROP FUNCTION IF EXISTS job_apply_all(jobs, events[]);
DROP FUNCTION IF EXISTS workflow_apply_all(workflows, events[]);
DROP FUNCTION IF EXISTS job_apply(jobs, events);
DROP FUNCTION IF EXISTS workflow_apply(workflows, events);
DROP FUNCTION IF EXISTS event_upcast(events);
DROP FUNCTION IF EXISTS event_upcast_failed_v1(events);
DROP FUNCTION IF EXISTS state_next(text, text, text, text);

ALTER TABLE events RENAME TO events_v1;
ALTER TABLE events_v1 ALTER COLUMN position DROP IDENTITY;
ALTER INDEX events_pkey RENAME TO events_v1_pkey;
ALTER INDEX events_stream_id_version_key RENAME TO events_v1_stream_version;
ALTER INDEX events_xid_position RENAME TO events_v1_xid_position;
ALTER INDEX events_workflow RENAME TO events_v1_workflow;
ALTER INDEX events_idempotency RENAME TO events_v1_idempotency;

-- 2. The canonical encoding of an event, version 1: the exact bytes its hash
--    covers. Versioned on purpose: changing it would break every stored chain,
--    so a new encoding is a new function (and a new line in the log's schema).
--    Binary and length-prefixed, so that no value can be mistaken for another:
--      "QFE1"                                  4 bytes
--      stream_id                               16 bytes (the UUID's bytes)
--      version                                 int32, big-endian
--      schema_version                          int16, big-endian
--      occurred_at                             int64, big-endian: microseconds
--                                              since 2000-01-01 00:00:00 UTC
--      stream_type, type, actor                each: int32 byte length, then UTF-8
--      workflow_id                             1 byte 0 (none), or 1 and 16 bytes
--      tags                                    int32 -1 (none), or length and the
--                                              jsonb text (PostgreSQL's rendering)
--      data                                    the jsonb text, to the end
--    docs/ARCHITECTURE.md says how to reproduce it outside the database.
CREATE FUNCTION event_canonical_v1(stream_type text, stream_id uuid, version integer, type text,
                                   schema_version smallint, data jsonb, tags jsonb, workflow_id uuid,
                                   occurred_at timestamptz, actor text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '\x51464531'::bytea || uuid_send(stream_id) || int4send(version) || int2send(schema_version)
           || timestamptz_send(occurred_at)
           || int4send(octet_length(stream_type)) || textsend(stream_type)
           || int4send(octet_length(type)) || textsend(type)
           || int4send(octet_length(actor)) || textsend(actor)
           || CASE WHEN workflow_id IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || uuid_send(workflow_id) END
           || CASE WHEN tags IS NULL THEN '\xffffffff'::bytea
                   ELSE int4send(octet_length(tags::text)) || textsend(tags::text) END
           || textsend(data::text)
$$;

-- hash = SHA-256(previous hash in the stream (empty for the first) || canonical bytes).
CREATE FUNCTION event_chain_step(state bytea, prev bytea, canonical bytea)
RETURNS bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(coalesce(state, prev, ''::bytea) || canonical)
$$;

-- As a window over a stream's events in version order it gives each event its
-- hash; `prev` (read from the first row) is the head of the chain before them.
CREATE AGGREGATE event_chain(bytea, bytea) (SFUNC = event_chain_step, STYPE = bytea);

DO $$
BEGIN
    IF pg_encoding_to_char(encoding) <> 'UTF8' FROM pg_database WHERE datname = current_database() THEN
        RAISE EXCEPTION 'QForge needs a UTF8 database (this one is %): an event''s hash covers its text as UTF-8',
            (SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database());
    END IF;
END $$;

-- 3. The partitioned log.
CREATE SEQUENCE events_position_seq AS bigint;

CREATE TABLE events (
    position       bigint      NOT NULL DEFAULT nextval('events_position_seq'),
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- job | workflow, and the streams later features add (the fold checks them).
    stream_type    text        NOT NULL,
    stream_id      uuid        NOT NULL,
    version        integer     NOT NULL CHECK (version > 0),
    type           text        NOT NULL,
    schema_version smallint    NOT NULL DEFAULT 1,
    data           jsonb       NOT NULL DEFAULT '{}',
    -- Tags never change: new events carry them only on a stream's first event.
    tags           jsonb,
    workflow_id    uuid,
    occurred_at    timestamptz NOT NULL DEFAULT now(),
    actor          text        NOT NULL DEFAULT 'system',
    hash           bytea       NOT NULL CHECK (octet_length(hash) = 32)
) PARTITION BY RANGE (position);
ALTER SEQUENCE events_position_seq OWNED BY events.position;

-- The gapless reader's order is (xid, position); one xid covers a whole batch,
-- so the index on xid alone deduplicates to a few bytes per event.
CREATE INDEX events_xid ON events (xid);
CREATE INDEX events_stream ON events (stream_id);
CREATE INDEX events_workflow ON events (workflow_id, position) WHERE workflow_id IS NOT NULL;
-- Appends are in position order: block ranges are enough for the range reads
-- of replay, archive and audit (one index entry per 128 pages).
CREATE INDEX events_position_brin ON events USING brin (position);

-- How big a partition is, in positions; the monitor's leader keeps partitions
-- created ahead of the appends (log_maintain, in the definitions).
CREATE TABLE log_settings (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    partition_size  bigint  NOT NULL DEFAULT 10000000 CHECK (partition_size >= 100),
    partitions_ahead integer NOT NULL DEFAULT 2 CHECK (partitions_ahead >= 1)
);
INSERT INTO log_settings DEFAULT VALUES;

-- Partitions for what is there and for what comes next (partitions_ahead
-- wholly beyond the next position, as log_maintain keeps them).
DO $$
DECLARE
    size bigint := (SELECT partition_size FROM log_settings);
    ahead integer := (SELECT partitions_ahead FROM log_settings);
    last bigint := (SELECT coalesce(max(position), 0) FROM events_v1);
    lo bigint := 1;
BEGIN
    PERFORM setval('events_position_seq', greatest(last, 1), last > 0);
    WHILE lo < last + 1 + ahead * size LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%s) TO (%s)',
                       'events_' || lpad(lo::text, 19, '0'), lo, lo + size);
        lo := lo + size;
    END LOOP;
END $$;

-- 4. The events, as they were, with their hashes.
INSERT INTO events (position, xid, stream_type, stream_id, version, type, schema_version, data, tags,
                    workflow_id, occurred_at, actor, hash)
SELECT position, xid, stream_type, stream_id, version, type, schema_version, data, tags, workflow_id,
       occurred_at, actor,
       event_chain(NULL::bytea, event_canonical_v1(stream_type, stream_id, version, type, schema_version,
                                                   data, tags, workflow_id, occurred_at, actor))
           OVER (PARTITION BY stream_id ORDER BY version)
  FROM events_v1
 ORDER BY position;

-- 5. Idempotency keys: a partitioned table cannot hold a unique index that
--    leaves out the partition key, so the keys live here. The enqueue inserts
--    its key first (ON CONFLICT DO NOTHING waits for a racing inserter).
CREATE TABLE idempotency_keys (
    stream_type text NOT NULL,
    key         text NOT NULL,
    stream_id   uuid NOT NULL,
    PRIMARY KEY (stream_type, key)
);
INSERT INTO idempotency_keys (stream_type, key, stream_id)
SELECT stream_type, data ->> 'idempotency_key', stream_id FROM events_v1
 WHERE version = 1 AND data ? 'idempotency_key';

DROP TABLE events_v1;

-- 6. The read model keeps the head of each stream: where its last event is,
--    and that event's hash (the next append chains to it).
ALTER TABLE jobs ADD COLUMN last_position bigint, ADD COLUMN chain bytea;
ALTER TABLE workflows ADD COLUMN last_position bigint, ADD COLUMN chain bytea;
UPDATE jobs j SET last_position = h.position, chain = h.hash
  FROM (SELECT DISTINCT ON (stream_id) stream_id, position, hash FROM events
         ORDER BY stream_id, version DESC) h
 WHERE j.id = h.stream_id;
UPDATE workflows w SET last_position = h.position, chain = h.hash
  FROM (SELECT DISTINCT ON (stream_id) stream_id, position, hash FROM events
         ORDER BY stream_id, version DESC) h
 WHERE w.id = h.stream_id;
-- The key table is the guard now; the projection's unique index is one more
-- write per enqueue for nothing.
DROP INDEX IF EXISTS jobs_idempotency;

-- 7. Counters of jobs by queue and status (GET /queues, /metrics), kept in the
--    statement that changes jobs (definitions/35_counters.sql): each statement
--    inserts its deltas, which no other writer waits for, and the monitor's
--    leader folds them into queue_counts now and then. Readers add both.
CREATE TABLE queue_counts (
    queue  text   NOT NULL,
    status text   NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (queue, status)
);
CREATE TABLE queue_count_deltas (
    queue  text   NOT NULL,
    status text   NOT NULL,
    n      bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);
INSERT INTO queue_counts (queue, status, n) SELECT queue, status, count(*) FROM jobs GROUP BY queue, status;
