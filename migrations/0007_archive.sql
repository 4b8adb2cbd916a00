-- Archive segments: the log's partitions that `qforge archive` wrote out (a
-- compressed file of their events and a manifest, in the archive directory),
-- verified, and then detached and dropped. The archived part of the log is a
-- prefix of its positions: partitions are archived oldest first.
CREATE TABLE archive_segments (
    segment           text        PRIMARY KEY,  -- the file's name, without its extensions
    lower_position    bigint      NOT NULL,     -- the partition's range, [lower, upper)
    upper_position    bigint      NOT NULL,
    first_position    bigint,                   -- the events in it (none: an empty partition)
    last_position     bigint,
    events            bigint      NOT NULL,
    first_occurred_at timestamptz,
    last_occurred_at  timestamptz,
    sha256            text        NOT NULL,     -- of the compressed file
    bytes             bigint      NOT NULL,     -- compressed
    raw_bytes         bigint      NOT NULL,     -- what the events take as text
    -- A Bloom filter of the stream ids in it (manifest and here), so that an
    -- archived execution's id names its segments (HTTP 410) without the file.
    streams           bytea       NOT NULL,
    bloom_hashes      integer     NOT NULL,
    manifest          jsonb       NOT NULL,
    -- sealed: written, verified and recorded; the read model let go of what it
    -- covers. dropped: the partition is gone from the database.
    state             text        NOT NULL CHECK (state IN ('sealed', 'dropped')),
    sealed_at         timestamptz NOT NULL DEFAULT now(),
    dropped_at        timestamptz,
    UNIQUE (lower_position)
);
