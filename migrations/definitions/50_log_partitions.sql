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

-- Create partitions until partitions_ahead of them lie wholly beyond the next
-- position; returns how many were made. A partition is made empty, outside the
-- log, and then attached: ATTACH takes SHARE UPDATE EXCLUSIVE on events, which
-- appends (ROW EXCLUSIVE) do not wait for.
CREATE OR REPLACE FUNCTION log_maintain() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    size bigint;
    ahead integer;
    top bigint;
    next_position bigint := log_next_position();
    made integer := 0;
    name text;
BEGIN
    SELECT partition_size, partitions_ahead INTO size, ahead FROM log_settings;
    SELECT coalesce(max(upper), 1) INTO top FROM log_partitions();
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
-- like those of a rolled-back append). Returns that position.
CREATE OR REPLACE FUNCTION log_close_current() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    next_position bigint;
    boundary bigint;
BEGIN
    -- Appends take positions while they insert, under ROW EXCLUSIVE: with them
    -- held off for this transaction, the sequence can only move by our hand.
    LOCK TABLE events IN SHARE MODE;
    next_position := log_next_position();
    SELECT upper INTO boundary FROM log_partitions() WHERE next_position >= lower AND next_position < upper;
    IF boundary IS NULL OR next_position = (SELECT lower FROM log_partitions() WHERE upper = boundary) THEN
        RETURN next_position;  -- nothing written there yet: it is as good as closed
    END IF;
    PERFORM setval('events_position_seq', boundary - 1, true);
    PERFORM log_maintain();
    RETURN boundary;
END $$;
