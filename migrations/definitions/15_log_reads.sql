-- The log is its live partitions (events) and its packed ones
-- (events_packed, migration 0019: blocks of consecutive positions, packed_event
-- elements holding every stored column). Each event is in exactly one of them
-- (log_pack_finish attaches a packed partition and drops its live one in one
-- transaction), and readers that may reach packed positions read through
-- these: a stream's events, a workflow's, a range of positions, a page of the
-- gapless read. A block spans at most log_pack_block() positions, so the
-- blocks of a range are one index range (first_position above from less that).
-- Positions per packed block (qforge.log.pack reads it too).
CREATE OR REPLACE FUNCTION log_pack_block() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 64
$$;

-- The key of an id in a packed block's streams and workflows: its last 32
-- bits, as an integer (the random part of a UUIDv7 or v4; a function of the
-- id's bytes alone, the same on every machine and version).
CREATE OR REPLACE FUNCTION log_id_key(id uuid) RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ('x' || right(id::text, 8))::bit(32)::integer
$$;

CREATE OR REPLACE FUNCTION log_stream(id uuid) RETURNS SETOF events LANGUAGE sql STABLE AS $$
    SELECT * FROM events e WHERE e.stream_id = id
    UNION ALL
    SELECT u.* FROM events_packed p, unnest(p.events) u WHERE p.streams @> ARRAY[log_id_key(id)] AND u.stream_id = id
$$;

CREATE OR REPLACE FUNCTION log_workflow(id uuid) RETURNS SETOF events LANGUAGE sql STABLE AS $$
    SELECT * FROM events e WHERE e.workflow_id = id
    UNION ALL
    SELECT u.* FROM events_packed p, unnest(p.events) u WHERE p.workflows @> ARRAY[log_id_key(id)] AND u.workflow_id = id
$$;

CREATE OR REPLACE FUNCTION log_range(from_position bigint, to_position bigint) RETURNS SETOF events
LANGUAGE sql STABLE AS $$
    SELECT * FROM events e WHERE e.position >= from_position AND e.position < to_position
    UNION ALL
    SELECT u.* FROM events_packed p, unnest(p.events) u
     WHERE p.first_position > from_position - log_pack_block() AND p.first_position < to_position
       AND u.position >= from_position AND u.position < to_position
$$;

-- xid8 has no arithmetic: through bigint (an xid8 is below 2^63 in practice).
CREATE OR REPLACE FUNCTION xid8_minus(x xid8, n bigint) RETURNS xid8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(x::text::bigint - n, 0)::text::xid8
$$;

-- The first `n` packed blocks, in (min_xid, first_position) order, of each
-- kind that may hold an event after (after_xid, after_position): those that
-- begin at a lower xid but reach the cursor's (a block begins at most
-- `spread` below where it ends: log_packs.xid_spread, the widest of any
-- block), those that begin at the cursor's xid and reach beyond it, and those
-- that begin after the cursor (beginning at the cursor's xid, less than a
-- block before it). Each is an index range merged across the packed
-- partitions under its LIMIT (sorting off, in the callers): none walks the
-- blocks of one big transaction that lie before the cursor, nor sorts those
-- after it. A block of the first kind that ends at the cursor's xid holds
-- something after the cursor only if it ends after its position: without that
-- test, a cursor in a big transaction that was interleaved with another one
-- (blocks of both xids) took all their shared blocks, those before it too,
-- ahead of its own, each leaving the page short, and the caller doubled its
-- take until it had them all (1.3 s a page of 200 past 1.8M interleaved
-- positions; 19 ms with the test, 0.5 ms live). A cursor inside such a
-- stretch still takes every shared block after it, as blocks of the older
-- xid, before any page can end (about 1 s a page there); taking blocks in
-- (greatest(min_xid, after_xid), first_position) order would end that.
CREATE OR REPLACE FUNCTION log_packed_after(after_xid xid8, after_position bigint, spread bigint, n integer)
RETURNS SETOF events_packed LANGUAGE sql STABLE AS $$
    (SELECT * FROM events_packed p
      WHERE p.min_xid >= xid8_minus(after_xid, spread) AND p.min_xid < after_xid AND p.max_xid >= after_xid
        AND (p.max_xid > after_xid OR p.last_position > after_position)
      ORDER BY p.min_xid, p.first_position LIMIT n)
    UNION ALL
    (SELECT * FROM events_packed p
      WHERE p.min_xid = after_xid AND p.max_xid > after_xid AND p.first_position <= after_position - log_pack_block()
      ORDER BY p.min_xid, p.first_position LIMIT n)
    UNION ALL
    (SELECT * FROM events_packed p
      WHERE (p.min_xid, p.first_position) > (after_xid, after_position - log_pack_block())
      ORDER BY p.min_xid, p.first_position LIMIT n)
$$;

-- A page of the gapless read of the global log (events_after in app/sql):
-- the events after (xid, position), below the snapshot's xmin, in (xid,
-- position) order. The (xid, position) index answers it on the live
-- partitions by merging their index scans under the LIMIT; but the planner's
-- estimate of a row comparison can be tiny (rows=2 right after the oldest
-- transaction) and it then sorts everything after the cursor instead (180 ms a
-- page over a big transaction, 0.3 ms merged). Sorting is off in here, so the
-- merge is what it does.
-- JIT is off too: the body is planned with its arguments unknown, so LIMIT page
-- is costed as a tenth of the log, and on a large log that cost crossed JIT's
-- thresholds. With 50M events every page was compiled, inlined and optimized
-- first: 163 ms of JIT for a read that takes 0.4 ms (SSE catch-up at 0.06x of
-- an empty database's speed).
-- Packed blocks (log_packed_after) are taken in (min_xid, first_position)
-- order: every event of a block not taken comes at or after the next block's
-- (min_xid, first_position) (`bound`), so the page is the live page and the
-- packed events below bound, merged; more blocks are taken while that leaves
-- the page short. A cursor past every packed xid (the live tail) reads the
-- live partitions alone, as before any were packed.
-- Whether anything is packed is asked of log_packs in any state, not only
-- 'packed': a page that began (took its snapshot) before a pack's finish and
-- waited for its lock plans with the partition attached and its live one
-- dropped, while the snapshot still sees the row as 'filling'; its blocks and
-- their spread and newest xid were written and committed together, before.
CREATE OR REPLACE FUNCTION events_after_page(after_xid xid8, after_position bigint, page integer)
RETURNS SETOF events LANGUAGE plpgsql STABLE SET enable_sort = off SET jit = off ROWS 500 AS $$
DECLARE
    horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
    spread bigint;
    newest xid8;
    take integer := 2 * page / log_pack_block() + 2;
    bound_xid xid8;
    bound_position bigint;
    found events[];
BEGIN
    SELECT max(l.xid_spread), max(l.max_xid) INTO spread, newest FROM log_packs l;
    IF spread IS NULL OR after_xid > newest THEN  -- nothing packed after the cursor: the live log alone
        RETURN QUERY SELECT * FROM events e
                      WHERE (e.xid, e.position) > (after_xid, after_position) AND e.xid < horizon
                      ORDER BY e.xid, e.position
                      LIMIT page;
        RETURN;
    END IF;
    LOOP
        SELECT p.min_xid, p.first_position INTO bound_xid, bound_position
          FROM log_packed_after(after_xid, after_position, spread, take + 1) p
         ORDER BY p.min_xid, p.first_position OFFSET take LIMIT 1;
        WITH live AS (
            SELECT * FROM events e
             WHERE (e.xid, e.position) > (after_xid, after_position) AND e.xid < horizon
             ORDER BY e.xid, e.position
             LIMIT page
        ), blocks AS (
            SELECT p.events FROM log_packed_after(after_xid, after_position, spread, take) p
             ORDER BY p.min_xid, p.first_position LIMIT take
        ), packed AS (
            SELECT u.* FROM blocks b, unnest(b.events) u
             WHERE (u.xid, u.position) > (after_xid, after_position) AND u.xid < horizon
        ), merged AS (
            SELECT * FROM live UNION ALL SELECT * FROM packed
        )
        SELECT array_agg(m::events ORDER BY m.xid, m.position) INTO found
          FROM (SELECT * FROM merged m
                 WHERE bound_xid IS NULL OR (m.xid, m.position) < (bound_xid, bound_position)
                 ORDER BY m.xid, m.position
                 LIMIT page) m;
        -- Short of a page only when every block that could follow the cursor was taken.
        EXIT WHEN coalesce(cardinality(found), 0) >= page OR bound_xid IS NULL;
        take := take * 2;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(found) f ORDER BY f.xid, f.position;
END $$;

-- Where "the live tail" starts (events_tail_cursor in app/sql): the last
-- event a gapless reader can see now, or the one `back` events before it.
-- Packed blocks are taken in (max_xid, last_position) order from the top:
-- every event of a block not taken comes at or before the next one's.
CREATE OR REPLACE FUNCTION log_tail_cursor(back integer) RETURNS TABLE (xid xid8, "position" bigint)
LANGUAGE plpgsql STABLE SET jit = off AS $$
#variable_conflict use_column
DECLARE
    horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
    take integer := back / log_pack_block() + 2;
    bound_xid xid8;
    bound_position bigint;
    found events[];
BEGIN
    IF NOT EXISTS (SELECT FROM log_packs l) THEN  -- the live log alone (any state: see events_after_page)
        RETURN QUERY SELECT e.xid, e.position FROM events e WHERE e.xid < horizon
                      ORDER BY e.xid DESC, e.position DESC OFFSET back LIMIT 1;
        RETURN;
    END IF;
    LOOP
        SELECT p.max_xid, p.last_position INTO bound_xid, bound_position FROM events_packed p
         ORDER BY p.max_xid DESC, p.last_position DESC OFFSET take LIMIT 1;
        WITH live AS (
            SELECT * FROM events e WHERE e.xid < horizon
             ORDER BY e.xid DESC, e.position DESC LIMIT back + 1
        ), blocks AS (
            SELECT p.events FROM events_packed p ORDER BY p.max_xid DESC, p.last_position DESC LIMIT take
        ), packed AS (
            SELECT u.* FROM blocks b, unnest(b.events) u WHERE u.xid < horizon
        ), merged AS (
            SELECT * FROM live UNION ALL SELECT * FROM packed
        )
        SELECT array_agg(m::events ORDER BY m.xid DESC, m.position DESC) INTO found
          FROM (SELECT * FROM merged m
                 WHERE bound_xid IS NULL OR (m.xid, m.position) > (bound_xid, bound_position)
                 ORDER BY m.xid DESC, m.position DESC
                 LIMIT back + 1) m;
        EXIT WHEN coalesce(cardinality(found), 0) > back OR bound_xid IS NULL;
        take := take * 2;
    END LOOP;
    RETURN QUERY SELECT f.xid, f.position FROM unnest(found) f
                  ORDER BY f.xid DESC, f.position DESC OFFSET back LIMIT 1;
END $$;

-- A page of the gapless read as readers see it (events_after in app/sql: the
-- event stream's hub, GET /events): current shapes, and the tags of a stream's
-- later events taken from its row, looked up by key. The lookups must stay
-- index lookups whatever the statistics say: a reader's plan is cached for its
-- session (a prepared statement, generic after a few runs), and one cached
-- while jobs was nearly empty (a new database, before autovacuum's first
-- ANALYZE) scanned jobs once per event for good: each page took longer as jobs
-- grew, the hub fell behind and read bigger pages (0.1 s a page at 20,000 jobs,
-- 1.2 s at 30,000: SSE lags of 2 s in the benchmark). Sequential scans are off
-- in here, so a plan made at any size looks streams up by key; PL/pgSQL keeps
-- the plan for the session, so the wrapper costs no planning per page.
CREATE OR REPLACE FUNCTION events_after_read(after_xid xid8, after_position bigint, page integer)
RETURNS TABLE ("position" bigint, xid xid8, stream_type text, stream_id uuid, version integer, type text,
               schema_version smallint, data jsonb, tags jsonb, workflow_id uuid,
               occurred_at timestamptz, actor text)
LANGUAGE plpgsql STABLE SET enable_seqscan = off ROWS 500 AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT e.position, e.xid, e.stream_type, e.stream_id, e.version, e.type,
           event_upcast_version(e.type, e.schema_version),
           event_read_data(e.type, e.schema_version, e.data, e.actor, e.occurred_at),
           -- (a join instead would have the planner hash a whole projection for a page)
           coalesce(e.tags,
                    CASE e.stream_type WHEN 'job' THEN (SELECT j.tags FROM jobs j WHERE j.id = e.stream_id)
                                       WHEN 'workflow' THEN (SELECT w.tags FROM workflows w WHERE w.id = e.stream_id)
                    END, '{}'),
           e.workflow_id, e.occurred_at, e.actor
      FROM events_after_page(after_xid, after_position, page) e
     ORDER BY e.xid, e.position;
END $$;

-- When a claimed job became claimable: the latest of its events before
-- `before_version` that can make a job pending (`ready_types`, from the state
-- table: qforge.events.states.JOB_READY_EVENTS), at its run_at if later. The
-- metrics' and the dashboard's enqueue-to-start latency both read it.
CREATE OR REPLACE FUNCTION job_ready_at(job_id uuid, before_version integer, ready_types text[])
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT greatest(p.occurred_at, coalesce((p.data ->> 'run_at')::timestamptz, p.occurred_at))
      FROM log_stream(job_id) p
     WHERE p.version < before_version AND p.type = ANY(ready_types)
     ORDER BY p.version DESC
     LIMIT 1
$$;
