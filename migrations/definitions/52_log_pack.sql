-- Packing the log's closed partitions (migration 0019; qforge.log.pack
-- drives it): a partition's events go into blocks of log_pack_block() (64)
-- consecutive positions in events_packed_<lower>, a table beside the log,
-- filled a window at a time in short transactions (a long one would hold its
-- xid below every later append, and the gapless readers would wait for it);
-- then one short transaction attaches it to events_packed and drops the live
-- partition, so every reader sees each event once, live or packed. Killed at
-- any point, packing goes on from log_packs.filled_to; nothing is lost, since
-- the live partition goes only in the transaction that makes the packed one
-- part of the log.

-- Packed partitions are append-only like the live ones.
CREATE OR REPLACE TRIGGER events_packed_no_update_delete BEFORE UPDATE OR DELETE ON events_packed
    FOR EACH ROW EXECUTE FUNCTION events_refuse_change('events_packed');
CREATE OR REPLACE TRIGGER events_packed_no_truncate BEFORE TRUNCATE ON events_packed
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change('events_packed');

CREATE OR REPLACE FUNCTION log_pack_table(lower bigint) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'events_packed_' || lpad(lower::text, 19, '0')
$$;

-- Begin (or go on with) packing the live partition that starts at `lower`,
-- which the caller has found closed and settled (every position in it
-- committed or never will be: qforge.log.pack). Returns where filling
-- goes on from.
CREATE OR REPLACE FUNCTION log_pack_begin(lower bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    upper bigint := (SELECT p.upper FROM log_partitions() p WHERE p.lower = log_pack_begin.lower);
    name text := log_pack_table(lower);
BEGIN
    IF upper IS NULL THEN
        RAISE EXCEPTION 'no live partition of the log starts at position %', lower;
    END IF;
    INSERT INTO log_packs (lower_position, upper_position, state, filled_to)
    VALUES (lower, upper, 'filling', lower) ON CONFLICT (lower_position) DO NOTHING;
    IF to_regclass(name) IS NULL THEN
        -- (Its indexes come once it is filled: log_pack_indexes.)
        EXECUTE format('CREATE TABLE %I (LIKE events_packed INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                       ' INCLUDING STORAGE)', name);
        -- ATTACH then needs no scan to know every block belongs (the partition's bound).
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (first_position >= %s AND first_position < %s)',
                       name, name || '_bound', lower, upper);
        -- LZ4 where the server has it: about the same size as pglz, unpacked
        -- several times faster (a stream's history, a page of the gapless read).
        BEGIN
            EXECUTE format('ALTER TABLE %I ALTER COLUMN events SET COMPRESSION lz4', name);
        EXCEPTION WHEN feature_not_supported THEN
            NULL;  -- built without LZ4: pglz, the default
        END;
    END IF;
    RETURN (SELECT filled_to FROM log_packs WHERE lower_position = lower);
END $$;

-- Pack the positions [filled_to, up_to) of the partition at `lower` (up_to a
-- block boundary, or its upper bound): one short transaction. Returns the
-- events packed.
CREATE OR REPLACE FUNCTION log_pack_fill(lower bigint, up_to bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    pack log_packs;
    packed bigint;
    made bigint;
    spread bigint;
    newest xid8;
BEGIN
    SELECT * INTO pack FROM log_packs WHERE lower_position = lower FOR UPDATE;
    IF pack IS NULL OR pack.state <> 'filling' THEN
        RAISE EXCEPTION 'the partition at % is not being packed', lower;
    END IF;
    IF up_to <= pack.filled_to THEN
        RETURN 0;
    END IF;
    IF up_to > pack.upper_position OR (up_to - lower) % log_pack_block() <> 0 AND up_to <> pack.upper_position THEN
        RAISE EXCEPTION 'packing stops at a block boundary: % is not one', up_to;
    END IF;
    EXECUTE format($f$
        WITH blocks AS (
            INSERT INTO %I (first_position, last_position, min_xid, max_xid, streams, workflows, events)
            SELECT min(e.position), max(e.position), min(e.xid), max(e.xid),
                   array_agg(DISTINCT log_id_key(e.stream_id)),
                   coalesce(array_agg(DISTINCT log_id_key(e.workflow_id)) FILTER (WHERE e.workflow_id IS NOT NULL),
                            '{}'),
                   array_agg(ROW(e.position, e.xid, e.stream_type, e.stream_id, e.version, e.type,
                                 e.schema_version, e.data, e.tags, e.workflow_id, e.occurred_at, e.actor,
                                 e.hash)::packed_event ORDER BY e.position)
              FROM %I e
             WHERE e.position >= $1 AND e.position < $2
             GROUP BY (e.position - $3) / log_pack_block()
            RETURNING cardinality(events) AS n, max_xid::text::bigint - min_xid::text::bigint AS spread,
                      max_xid
        )
        SELECT coalesce(sum(n), 0), count(*), coalesce(max(spread), 0), max(max_xid) FROM blocks$f$,
        log_pack_table(lower), 'events_' || lpad(lower::text, 19, '0'))
    INTO packed, made, spread, newest USING pack.filled_to, up_to, lower;
    UPDATE log_packs SET filled_to = up_to, events = events + packed, blocks = blocks + made,
                         xid_spread = greatest(xid_spread, spread), max_xid = greatest(max_xid, newest)
     WHERE lower_position = lower;
    RETURN packed;
END $$;

-- The statements that give a filled packed partition the indexes of
-- events_packed, each to be run on its own (CONCURRENTLY: a build in one
-- transaction would hold its xid for as long as it takes, and the gapless
-- readers would wait for it; built once the blocks are in, a GIN index is
-- also a third of the size of one grown block by block). ATTACH then adopts
-- them. Invalid ones, left by a build that was killed, are dropped first.
CREATE OR REPLACE FUNCTION log_pack_indexes(lower bigint) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT s.statement FROM (
        SELECT 1 AS step, format('DROP INDEX IF EXISTS %s', i.indexrelid::regclass) AS statement
          FROM pg_index i
         WHERE i.indrelid = to_regclass(log_pack_table(lower)) AND NOT i.indisvalid
        UNION ALL
        SELECT 2, regexp_replace(pg_get_indexdef(i.indexrelid), '^CREATE INDEX \S+ ON ONLY \S+',
                                 format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I',
                                        log_pack_table(lower) || substr(c.relname, length('events_packed') + 1),
                                        log_pack_table(lower)))
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'events_packed'::regclass
    ) s ORDER BY s.step, s.statement
$$;

-- Make the packed partition part of the log and drop the live one, in one
-- transaction: each waits at most lock_timeout for its lock (the caller sets
-- it short and tries again: ATTACH takes SHARE UPDATE EXCLUSIVE on
-- events_packed, the DROP ACCESS EXCLUSIVE on events for the moment it takes).
-- Refused unless every position is filled and the blocks hold as many events
-- as the live partition.
CREATE OR REPLACE FUNCTION log_pack_finish(lower bigint, live_events bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    pack log_packs;
BEGIN
    SELECT * INTO pack FROM log_packs WHERE lower_position = lower FOR UPDATE;
    IF pack IS NULL OR pack.state <> 'filling' OR pack.filled_to < pack.upper_position THEN
        RAISE EXCEPTION 'the partition at % is not wholly packed', lower;
    END IF;
    IF pack.events <> live_events THEN
        RAISE EXCEPTION 'the packed partition at % holds % events, the live one %', lower, pack.events, live_events;
    END IF;
    PERFORM set_config('qforge.log_maintenance', 'on', true);  -- see log_guard_ddl()
    EXECUTE format('ALTER TABLE events_packed ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                   log_pack_table(lower), lower, pack.upper_position);
    PERFORM log_guard_partition(log_pack_table(lower)::regclass, 'events_packed');
    EXECUTE format('DROP TABLE %I', 'events_' || lpad(lower::text, 19, '0'));
    UPDATE log_packs SET state = 'packed', packed_at = now() WHERE lower_position = lower;
END $$;

-- The live partitions a pack may take: closed below the settled horizon (see
-- archive_settled_position), ending `keep` positions or more before the next
-- append's (the monitor keeps the newest part of the log live: catch-ups and
-- recent histories read rows there), not archived, oldest first.
DROP FUNCTION IF EXISTS log_pack_candidates(bigint);
CREATE OR REPLACE FUNCTION log_pack_candidates(horizon bigint, keep bigint)
RETURNS TABLE (lower bigint, upper bigint) LANGUAGE sql STABLE AS $$
    SELECT p.lower, p.upper FROM log_partitions() p
     WHERE p.upper <= horizon AND p.upper <= log_next_position() - keep AND p.lower >= log_archived_before()
     ORDER BY p.lower
$$;

-- One of log_pack_indexes(lower)'s statements, run for the monitor's role
-- (SECURITY DEFINER, definitions/90_roles.sql: only the owner of the log may
-- build indexes on its tables). Without CONCURRENTLY, which a function cannot
-- run: the blocks' table is not part of the log yet, nobody reads it and only
-- packing writes it, so the plain build's lock holds up no one. Anything but a
-- statement of log_pack_indexes(lower) is refused.
CREATE OR REPLACE FUNCTION log_pack_make_index(lower bigint, statement text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM log_pack_indexes(lower) s WHERE s = statement) THEN
        RAISE EXCEPTION 'not an index statement of the packed partition at %: %', lower, statement
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    EXECUTE replace(statement, 'CREATE INDEX CONCURRENTLY', 'CREATE INDEX');
END $$;
