-- The partitions of the log: each holds a range of positions, [lower, upper).
-- The monitor's leader keeps log_settings.partitions_ahead empty partitions
-- beyond the last position handed out, so an append never waits for (or fails
-- for want of) maintenance. Only `qforge archive` detaches and drops one.

CREATE OR REPLACE FUNCTION log_partitions()
RETURNS TABLE (partition regclass, lower bigint, upper bigint) LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''?(\d+)''?\)'))[1]::bigint,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''?(\d+)''?\)'))[1]::bigint
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'events'::regclass
     ORDER BY 2
$$;

-- The next position an append will take.
CREATE OR REPLACE FUNCTION log_next_position() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM events_position_seq
$$;

-- One maker of partitions at a time: the monitor's leader (log_maintain) and
-- a command that closes the current partition (log_close_current, from qforge
-- archive or qforge pack) would otherwise both make the next partition: one
-- waits for the other's new table name while holding, or wanting, the lock on
-- events that the other needs to attach it (a deadlock, seen beside a busy
-- queue). Taken first, before any lock on events.
CREATE OR REPLACE FUNCTION log_maintenance_lock() RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(5856490902593536017)  -- 0x5146_6F72_6765_0011 ("QForge" + 17)
$$;

-- LOCK TABLE events IN SHARE MODE for the caller's transaction (qforge archive
-- and pack: archive_settle_lock in app/sql/archive.sql), callable by the
-- monitor's role (definitions/90_roles.sql).
CREATE OR REPLACE FUNCTION log_settle_lock() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE events IN SHARE MODE;
END $$;

-- Create partitions until partitions_ahead of them lie wholly beyond the next
-- position; returns how many were made. A partition is made empty, outside the
-- log, and then attached: ATTACH takes SHARE UPDATE EXCLUSIVE on events, which
-- appends (ROW EXCLUSIVE) do not wait for.
CREATE OR REPLACE FUNCTION log_maintain() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    size bigint;
    ahead integer;
    top bigint;
    next_position bigint;
    made integer := 0;
    name text;
BEGIN
    PERFORM log_maintenance_lock();
    next_position := log_next_position();
    SELECT partition_size, partitions_ahead INTO size, ahead FROM log_settings;
    SELECT coalesce(max(upper), 1) INTO top FROM log_partitions();
    PERFORM set_config('qforge.log_maintenance', 'on', true);  -- see log_guard_ddl()
    WHILE top < next_position + ahead * size LOOP
        name := 'events_' || lpad(top::text, 19, '0');
        EXECUTE format('CREATE TABLE %I (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE events ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                       name, top, top + size);
        PERFORM log_guard_partition(name::regclass);
        top := top + size;
        made := made + 1;
    END LOOP;
    RETURN made;
END $$;

-- End the partition being written now: the next append takes the first
-- position of the next partition (the positions in between are never used,
-- like those of a rolled-back append). Returns that position. Partitions
-- wholly beyond it hold nothing yet: those of another size than
-- log_settings.partition_size are made again at that size, so a new size
-- takes effect from here.
CREATE OR REPLACE FUNCTION log_close_current() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    next_position bigint;
    current_lower bigint;
    boundary bigint;
    size bigint := (SELECT partition_size FROM log_settings);
    empty regclass;
BEGIN
    PERFORM log_maintenance_lock();
    -- Appends take positions while they insert, under ROW EXCLUSIVE: with them
    -- held off for this transaction, the sequence can only move by our hand.
    LOCK TABLE events IN SHARE MODE;
    PERFORM set_config('qforge.log_maintenance', 'on', true);  -- see log_guard_ddl()
    next_position := log_next_position();
    SELECT lower, upper INTO current_lower, boundary FROM log_partitions()
     WHERE next_position >= lower AND next_position < upper;
    IF boundary IS NOT NULL AND next_position > current_lower THEN
        PERFORM setval('events_position_seq', boundary - 1, true);
        next_position := boundary;
    END IF;
    FOR empty IN SELECT partition FROM log_partitions()
                  WHERE lower >= next_position AND upper - lower <> size LOOP
        EXECUTE format('DROP TABLE %s', empty);
    END LOOP;
    PERFORM log_maintain();
    RETURN next_position;
END $$;

-- Where the archived part of the log ends: every position below it is in an
-- archive segment (sealed or dropped), none above. 1: nothing archived.
CREATE OR REPLACE FUNCTION log_archived_before() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(upper_position), 1) FROM archive_segments
$$;

-- Partitions are made (log_maintain) and let go (qforge archive) by QForge
-- only: DROP of a partition of the log, or a partition detached, is refused
-- otherwise. A guard against a slip of the hand; a superuser can still lift it
-- (see `qforge audit verify` for what catches that).
CREATE OR REPLACE FUNCTION log_guard_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    loose text;
BEGIN
    IF current_setting('qforge.archiving', true) = 'on'
       OR current_setting('qforge.log_maintenance', true) = 'on'
       OR to_regclass('events') IS NULL THEN
        RETURN;
    END IF;
    -- (A packed partition, events_packed_<lower> (52_log_pack.sql), is part of
    -- the log once log_packs says it is packed; before, it is being filled.)
    IF TG_EVENT = 'sql_drop' THEN
        SELECT o.object_identity INTO loose FROM pg_event_trigger_dropped_objects() o
         WHERE o.object_type = 'table' AND o.object_name ~ '^events_(packed_)?[0-9]{19}$' LIMIT 1;
    ELSE  -- ddl_command_end: a log partition no longer attached (detached)
        SELECT c.oid::regclass::text INTO loose FROM pg_class c
         WHERE (c.relname ~ '^events_[0-9]{19}$'
                OR c.relname ~ '^events_packed_[0-9]{19}$'
                   AND EXISTS (SELECT FROM log_packs l
                                WHERE l.state = 'packed' AND log_pack_table(l.lower_position) = c.relname))
           AND c.relkind = 'r'
           AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'events'::regclass)
           AND NOT EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = c.oid)
         LIMIT 1;
    END IF;
    IF loose IS NOT NULL THEN
        RAISE EXCEPTION 'the log''s partition % is let go only by `qforge archive`, which writes it out first', loose
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- Event triggers need a superuser; without one the guard is left out (said once).
DO $$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        DROP EVENT TRIGGER IF EXISTS log_guard_drop;
        DROP EVENT TRIGGER IF EXISTS log_guard_detach;
        CREATE EVENT TRIGGER log_guard_drop ON sql_drop EXECUTE FUNCTION log_guard_ddl();
        CREATE EVENT TRIGGER log_guard_detach ON ddl_command_end WHEN TAG IN ('ALTER TABLE')
            EXECUTE FUNCTION log_guard_ddl();
    ELSE
        RAISE NOTICE 'not a superuser: the guard against dropping or detaching the log''s partitions by hand is not installed';
    END IF;
END $$;

-- Is `id` (maybe) among the streams of an archive segment? Its Bloom filter
-- (app/log/segments.py Bloom): k bits (h1 + i*h2) mod size, h1 and h2 the
-- first two big-endian 32-bit words of sha256 of the id's bytes; get_bit counts
-- bits from the least significant of each byte, as the writer sets them.
CREATE OR REPLACE FUNCTION archive_bloom_has(streams bytea, hashes integer, id uuid)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT bool_and(get_bit(streams, ((h.h1 + i * h.h2) % (octet_length(streams)::bigint * 8))::integer) = 1)
      FROM (SELECT ('x' || encode(substr(d, 1, 4), 'hex'))::bit(32)::bigint AS h1,
                   ('x' || encode(substr(d, 5, 4), 'hex'))::bit(32)::bigint AS h2
              FROM sha256(uuid_send(id)) AS d) h,
           generate_series(0, hashes - 1) AS i
$$;

-- The read model lets go of what the archive holds whole: a finished job or
-- workflow all of whose events lie below `before` (the archived prefix of the
-- log). A workflow goes with its steps, and only when every step is finished
-- and archived too; a step stays while its workflow stays (the DAG view and the
-- workflow's advance read its steps). Anything still active stays, however
-- old its first events. Table names are left unqualified on purpose: replay
-- runs this on its scratch copies by putting them first on the search path.
--
-- It goes a window at a time: the workflows with an event in positions
-- [from_position, to_position), a window of the partition being archived
-- (a workflow's own events and its steps' all carry its id in workflow_id). A
-- workflow can only newly qualify when the last event of it or of its steps is
-- in that partition: one whose last such event lies in a partition archived
-- before was let go then, or was still active then and has had an event since.
-- So the release costs what the partition holds, not what the whole read model
-- does (scanning workflows by id, each partition of a long log had the archive
-- visit every workflow again). `qforge archive` calls it window by window,
-- each its own short transaction, so it never holds many row locks or makes
-- one long burst of WAL while appends go on. Tags go by the primary key:
-- execution_tags holds exactly the tags of each stream's first event, which
-- its jobs/workflows row keeps (30_fold.sql). They are gathered into arrays
-- first, and deleted by a second statement, by index lookups only (the SET
-- clauses): a window touches a few thousand rows, and a plan on stale or
-- missing statistics that hashes the whole of execution_tags (or scans it in
-- a loop) would do so for every window.
-- The workflows that may leave before `before` (both releases below): finished
-- before it, and every step of theirs too. Plain SQL and STABLE, so the planner
-- inlines it into the calling statement, which plans as if it were written there.
CREATE OR REPLACE FUNCTION archive_leaving_workflows(before bigint, job_done text[], workflow_done text[])
RETURNS TABLE (id uuid) LANGUAGE sql STABLE AS $$
    SELECT w.id FROM workflows w
     WHERE w.status = ANY(workflow_done) AND w.last_position < before
       AND NOT EXISTS (SELECT FROM jobs j
                        WHERE j.workflow_id = w.id
                          AND NOT (j.status = ANY(job_done) AND j.last_position < before))
$$;

DROP FUNCTION IF EXISTS archive_release_workflows(bigint, text[], text[], uuid, integer);
CREATE OR REPLACE FUNCTION archive_release_workflows(before bigint, job_done text[], workflow_done text[],
                                                     from_position bigint, to_position bigint)
RETURNS TABLE (jobs_released bigint, workflows_released bigint) LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    tag_keys text[];
    tag_values text[];
    tag_kinds text[];
    tag_ids uuid[];
BEGIN
    WITH scanned AS (
        -- (a workflow's own events name it in workflow_id too; the stream id
        -- covers any that do not)
        SELECT DISTINCT coalesce(e.workflow_id, e.stream_id) AS id FROM log_range(from_position, to_position) e
         WHERE (e.workflow_id IS NOT NULL OR e.stream_type = 'workflow')
    ), leaving AS (
        SELECT l.id FROM archive_leaving_workflows(before, job_done, workflow_done) l JOIN scanned s ON s.id = l.id
    ), gone_jobs AS (
        DELETE FROM jobs j
         WHERE j.workflow_id IN (SELECT id FROM leaving)
           AND j.status = ANY(job_done) AND j.last_position < before
        RETURNING j.id, 'job' AS kind, j.tags
    ), gone_workflows AS (
        DELETE FROM workflows w USING leaving l WHERE w.id = l.id RETURNING w.id, 'workflow' AS kind, w.tags
    ), gone AS (
        SELECT * FROM gone_jobs UNION ALL SELECT * FROM gone_workflows
    )
    SELECT (SELECT count(*) FROM gone_jobs), (SELECT count(*) FROM gone_workflows),
           t.keys, t.vals, t.kinds, t.ids
      INTO jobs_released, workflows_released, tag_keys, tag_values, tag_kinds, tag_ids
      FROM (SELECT array_agg(e.key) AS keys, array_agg(e.value) AS vals, array_agg(g.kind) AS kinds,
                   array_agg(g.id) AS ids
              FROM gone g, jsonb_each_text(g.tags) e) t;
    DELETE FROM execution_tags t
     USING unnest(tag_keys, tag_values, tag_kinds, tag_ids) u(key, value, kind, id)
     WHERE t.key = u.key AND t.value = u.value AND t.kind = u.kind AND t.id = u.id;
    RETURN NEXT;
END $$;

-- The jobs outside any workflow (a step goes with its workflow, in
-- archive_release_workflows), found the same way: the jobs with an event in
-- positions [from_position, to_position) rather than every row of jobs. A job
-- can only newly qualify when its last event is in the partition being
-- archived.
DROP FUNCTION IF EXISTS archive_release_jobs(bigint, text[], uuid, integer);
CREATE OR REPLACE FUNCTION archive_release_jobs(before bigint, job_done text[], from_position bigint,
                                                to_position bigint)
RETURNS TABLE (jobs_released bigint) LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    tag_keys text[];
    tag_values text[];
    tag_ids uuid[];
BEGIN
    WITH scanned AS (
        SELECT DISTINCT e.stream_id AS id FROM log_range(from_position, to_position) e
         WHERE e.stream_type = 'job' AND e.workflow_id IS NULL
    ), gone AS (
        DELETE FROM jobs j USING scanned s
         WHERE j.id = s.id AND j.workflow_id IS NULL AND j.status = ANY(job_done) AND j.last_position < before
        RETURNING j.id, j.tags
    )
    SELECT (SELECT count(*) FROM gone), t.keys, t.vals, t.ids
      INTO jobs_released, tag_keys, tag_values, tag_ids
      FROM (SELECT array_agg(e.key) AS keys, array_agg(e.value) AS vals, array_agg(g.id) AS ids
              FROM gone g, jsonb_each_text(g.tags) e) t;
    DELETE FROM execution_tags t
     USING unnest(tag_keys, tag_values, tag_ids) u(key, value, id)
     WHERE t.key = u.key AND t.value = u.value AND t.kind = 'job' AND t.id = u.id;
    RETURN NEXT;
END $$;

-- All of it at once, set-based (replay, on its scratch tables: whole tables,
-- no window).
CREATE OR REPLACE FUNCTION archive_release(before bigint, job_done text[], workflow_done text[])
RETURNS TABLE (jobs_released bigint, workflows_released bigint) LANGUAGE sql AS $$
    WITH leaving_workflows AS (
        SELECT l.id FROM archive_leaving_workflows(before, job_done, workflow_done) l
    ), gone_jobs AS (
        DELETE FROM jobs j
         WHERE j.status = ANY(job_done) AND j.last_position < before
           AND (j.workflow_id IS NULL OR j.workflow_id IN (SELECT id FROM leaving_workflows))
        RETURNING j.id
    ), gone_workflows AS (
        DELETE FROM workflows w USING leaving_workflows l WHERE w.id = l.id RETURNING w.id
    ), gone_tags AS (  -- runs to completion though nothing reads it (as every DELETE in WITH)
        DELETE FROM execution_tags t
         WHERE t.id IN (SELECT id FROM gone_jobs UNION ALL SELECT id FROM gone_workflows)
    )
    SELECT (SELECT count(*) FROM gone_jobs), (SELECT count(*) FROM gone_workflows)
$$;

-- Detach and drop the partition at `lower` (live, packed, and the blocks of a
-- pack left unfinished) once its archive segment is sealed, for a role that
-- does not own the log: the monitor's, archiving by retention
-- (QFORGE_ARCHIVE_AFTER; SECURITY DEFINER through definitions/90_roles.sql).
-- Not CONCURRENTLY, which cannot run in a function: the detach takes ACCESS
-- EXCLUSIVE on the log for the moment it takes, so the caller sets lock_timeout
-- short and tries again (qforge archive run by the log's owner detaches
-- CONCURRENTLY instead). A detach left pending by a killed CONCURRENTLY run is
-- for the owner's `qforge archive` to finish.
CREATE OR REPLACE FUNCTION log_archive_let_go(lower bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tables text[] := ARRAY['events_' || lpad(lower::text, 19, '0'), 'events_packed_' || lpad(lower::text, 19, '0')];
    name text;
    parent regclass;
    pending boolean;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM archive_segments s WHERE s.lower_position = lower AND s.state = 'sealed') THEN
        RAISE EXCEPTION 'the partition at % has no sealed archive segment: it stays', lower;
    END IF;
    PERFORM set_config('qforge.archiving', 'on', true);  -- see log_guard_ddl()
    FOREACH name IN ARRAY tables LOOP
        SELECT i.inhparent::regclass, i.inhdetachpending INTO parent, pending
          FROM pg_inherits i WHERE i.inhrelid = to_regclass(name);
        IF pending THEN
            RAISE EXCEPTION 'partition % is half detached: run qforge archive as the owner of the log', name;
        END IF;
        IF parent IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %s DETACH PARTITION %I', parent, name);
        END IF;
        EXECUTE format('DROP TABLE IF EXISTS %I', name);
    END LOOP;
END $$;
