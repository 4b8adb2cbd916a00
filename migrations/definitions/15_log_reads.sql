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
