-- A page of the gapless read of the global log (events_after in app/sql):
-- the events after (xid, position), below the snapshot's xmin, in (xid,
-- position) order. The (xid, position) index answers it by merging the
-- partitions' index scans under the LIMIT; but the planner's estimate of a
-- row comparison can be tiny (rows=2 right after the oldest transaction) and
-- it then sorts everything after the cursor instead (180 ms a page over a big
-- transaction, 0.3 ms merged). Sorting is off in here, so the merge is what
-- it does; a SET clause also keeps the function from being inlined.
CREATE OR REPLACE FUNCTION events_after_page(after_xid xid8, after_position bigint, page integer)
RETURNS SETOF events LANGUAGE sql STABLE SET enable_sort = off ROWS 500 AS $$
    SELECT * FROM events e
     WHERE (e.xid, e.position) > (after_xid, after_position)
       AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY e.xid, e.position
     LIMIT page
$$;

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
