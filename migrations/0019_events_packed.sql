-- Packed partitions of the log. A closed partition's events take about 230
-- bytes each as rows: a row's header and line pointer, the 32-byte hash and
-- the 16-byte stream id, which do not compress, and two indexes. Packed, a
-- partition's events go into blocks of consecutive positions, one row per
-- block: every column of every event kept (an element of packed_event, the
-- log's row as it is stored), the block compressed by TOAST as a whole, and
-- keys of the stream and workflow ids of the block indexed (GIN) so that a
-- stream's history still finds its blocks. About 110 bytes an event (the
-- no-op benchmark's history, blocks of 64). `qforge pack` (and the
-- monitor's leader) fills a partition of events_packed beside the live one in
-- short transactions, attaches it and drops the live one in one short
-- transaction (log_pack_* in the definitions), so every reader sees each event
-- exactly once, live or packed (log_stream, log_workflow, log_range,
-- events_after_page).
CREATE TYPE packed_event AS (
    position       bigint,
    xid            xid8,
    stream_type    text,
    stream_id      uuid,
    version        integer,
    type           text,
    schema_version smallint,
    data           jsonb,
    tags           jsonb,
    workflow_id    uuid,
    occurred_at    timestamptz,
    actor          text,
    hash           bytea
);

CREATE TABLE events_packed (
    first_position bigint         NOT NULL,
    last_position  bigint         NOT NULL,
    -- The block's xids: the gapless reader (events_after_page) takes blocks in
    -- (min_xid, first_position) order, log_tail_cursor in (max_xid,
    -- last_position) order, descending.
    min_xid        xid8           NOT NULL,
    max_xid        xid8           NOT NULL,
    -- The stream and workflow ids of the block's events as log_id_key gives
    -- them (4 bytes each, not 16: the GIN index finds the blocks that may
    -- hold an id, and the reader keeps only its events).
    streams        integer[]      NOT NULL,
    workflows      integer[]      NOT NULL,
    events         packed_event[] NOT NULL CHECK (cardinality(events) > 0)
) PARTITION BY RANGE (first_position);
CREATE INDEX events_packed_position ON events_packed (first_position);
CREATE INDEX events_packed_min_xid ON events_packed (min_xid, first_position);
CREATE INDEX events_packed_xid_range ON events_packed (min_xid, max_xid);
CREATE INDEX events_packed_max_xid ON events_packed (max_xid, last_position);
CREATE INDEX events_packed_streams ON events_packed USING gin (streams);
CREATE INDEX events_packed_workflows ON events_packed USING gin (workflows);

-- One row per partition being packed or packed: its range, how far the
-- filling came, the widest xid spread of its blocks and its newest xid (a
-- gapless reader past every packed xid reads the live partitions alone).
CREATE TABLE log_packs (
    lower_position bigint      PRIMARY KEY,
    upper_position bigint      NOT NULL,
    -- filling: blocks go into events_packed_<lower> (not yet part of the log);
    -- packed: it is attached and the live partition is gone.
    state          text        NOT NULL CHECK (state IN ('filling', 'packed')),
    filled_to      bigint      NOT NULL,  -- every position below it is in a block
    events         bigint      NOT NULL DEFAULT 0,
    blocks         bigint      NOT NULL DEFAULT 0,
    xid_spread     bigint      NOT NULL DEFAULT 0,
    max_xid        xid8,                  -- the newest xid in it
    started_at     timestamptz NOT NULL DEFAULT now(),
    packed_at      timestamptz
);
