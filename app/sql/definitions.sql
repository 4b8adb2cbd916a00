-- Stored workflow definitions (qforge.workflows.definitions).

-- name: definition_lock
-- One writer per name at a time, for the transaction: the version a writer
-- computes below is then the next one, and a first version cannot race.
SELECT pg_advisory_xact_lock(hashtextextended('qforge.definition:' || %(name)s, 0))

-- name: definition_append
-- The next DefinitionStored of the name's stream, chained to the head kept on
-- its definitions row (none for a first version). The fold
-- (definitions_fold) writes the version and moves the head.
WITH head AS (
    SELECT version, chain FROM definitions WHERE name = %(name)s
), input AS (
    SELECT %(id)s::uuid AS id, coalesce((SELECT version FROM head), 0) + 1 AS version,
           (SELECT chain FROM head) AS prev, %(data)s::jsonb AS data,
           coalesce(%(now)s::timestamptz, now()) AS at
)
INSERT INTO events (stream_type, stream_id, version, type, data, occurred_at, actor, hash)
SELECT 'definition', i.id, i.version, 'DefinitionStored', i.data, i.at, %(actor)s,
       event_hash(i.prev, 'definition', i.id, i.version, 'DefinitionStored', 1::smallint, i.data, NULL,
                  NULL, i.at, %(actor)s)
  FROM input i
RETURNING version

-- name: definition_get
-- A version of a definition, the latest when version is NULL.
SELECT v.name, v.version, v.document, v.created_at, v.actor, d.version AS latest_version
  FROM definition_versions v JOIN definitions d ON d.id = v.id
 WHERE v.name = %(name)s AND v.version = coalesce(%(version)s::integer, d.version)

-- name: definitions_known
SELECT name FROM definitions WHERE name = ANY(%(names)s::text[])

-- name: definitions_list
-- Every definition's latest version, by name, after a cursor (a name).
SELECT d.name, d.version, d.created_at, d.updated_at, v.document
  FROM definitions d JOIN definition_versions v ON v.id = d.id AND v.version = d.version
 WHERE %(after)s::text IS NULL OR d.name > %(after)s::text
 ORDER BY d.name
 LIMIT %(limit)s
