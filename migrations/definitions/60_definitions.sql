-- Stored definitions (issue 15): the fold of the `definition` stream, called
-- by events_project() (30_fold.sql) with a statement's events of the rare
-- streams, so replay's feed table folds them as the log does.
-- Tables are named unqualified: replay puts its scratch schema first.

-- Once its own statement trigger: each costs every append a call (issue 33).
DROP TRIGGER IF EXISTS events_project_definitions ON events;
DROP FUNCTION IF EXISTS definitions_project();

CREATE OR REPLACE FUNCTION definitions_fold(new_events events[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    stored bigint;
    applied bigint;
BEGIN
    SELECT count(*) INTO stored FROM unnest(new_events) e WHERE e.stream_type = 'definition';
    IF stored = 0 THEN
        RETURN;
    END IF;
    -- A stream carries one event type; anything else is a writer's bug.
    IF EXISTS (SELECT 1 FROM unnest(new_events) e WHERE e.stream_type = 'definition' AND e.type <> 'DefinitionStored') THEN
        RAISE EXCEPTION 'definition streams only take DefinitionStored events' USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO definition_versions (id, name, version, document, created_at, actor)
    SELECT e.stream_id, e.data ->> 'name', e.version, e.data -> 'document', e.occurred_at, e.actor
      FROM unnest(new_events) e
     WHERE e.stream_type = 'definition';
    -- The head moves to the newest version of each stream; every version must
    -- follow the head it found (one writer per name: the writer holds its lock).
    WITH newest AS (
        SELECT DISTINCT ON (e.stream_id) e.stream_id, e.data ->> 'name' AS name, e.version,
               e.occurred_at, e.position, e.hash,
               min(e.version) OVER (PARTITION BY e.stream_id) AS first_version,
               -- a set may hold several versions of a stream (replay feeds whole chunks):
               -- a new head's created_at is its first version's
               first_value(e.occurred_at) OVER (PARTITION BY e.stream_id ORDER BY e.version) AS first_at
          FROM unnest(new_events) e
         WHERE e.stream_type = 'definition'
         ORDER BY e.stream_id, e.version DESC
    ), checked AS (
        SELECT n.* FROM newest n LEFT JOIN definitions d ON d.id = n.stream_id
         WHERE coalesce(d.version, 0) = n.first_version - 1
    ), moved AS (
        INSERT INTO definitions AS d (name, id, version, created_at, updated_at, last_position, chain)
        SELECT c.name, c.stream_id, c.version, c.first_at, c.occurred_at, c.position, c.hash
          FROM checked c
        ON CONFLICT (id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at,
                                         last_position = excluded.last_position, chain = excluded.chain
        RETURNING d.id
    )
    SELECT count(*) INTO applied FROM moved;
    IF applied <> (SELECT count(DISTINCT e.stream_id) FROM unnest(new_events) e WHERE e.stream_type = 'definition') THEN
        RAISE EXCEPTION 'definition events out of order: a version did not follow its stream''s head'
              USING ERRCODE = 'unique_violation';
    END IF;
END $$;
