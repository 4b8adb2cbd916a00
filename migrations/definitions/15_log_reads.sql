-- A page of the gapless read of the global log (events_after in app/sql):
-- the events after (xid, position), below the snapshot's xmin, in (xid,
-- position) order. The (xid, position) index answers it by merging the
-- partitions' index scans under the LIMIT; but the planner's estimate of a
-- row comparison can be tiny (rows=2 right after the oldest transaction) and
-- it then sorts everything after the cursor instead (180 ms a page over a big
-- transaction, 0.3 ms merged). Sorting is off in here, so the merge is what
-- it does; a SET clause also keeps the function from being inlined.
-- JIT is off too: the body is planned with its arguments unknown, so LIMIT page
-- is costed as a tenth of the log, and on a large log that cost crossed JIT's
-- thresholds. With 50M events every page was compiled, inlined and optimized
-- first: 163 ms of JIT for a read that takes 0.4 ms (SSE catch-up at 0.06x of
-- an empty database's speed).
CREATE OR REPLACE FUNCTION events_after_page(after_xid xid8, after_position bigint, page integer)
RETURNS SETOF events LANGUAGE sql STABLE SET enable_sort = off SET jit = off ROWS 500 AS $$
    SELECT * FROM events e
     WHERE (e.xid, e.position) > (after_xid, after_position)
       AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY e.xid, e.position
     LIMIT page
$$;

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
      FROM events p
     WHERE p.stream_id = job_id AND p.version < before_version AND p.type = ANY(ready_types)
     ORDER BY p.version DESC
     LIMIT 1
$$;
