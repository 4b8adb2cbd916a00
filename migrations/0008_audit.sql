-- The audit's checkpoints: chained records over the global order of the log,
-- made by the monitor's leader (and `qforge audit checkpoint`). Each one covers
-- the events that became visible to a gapless reader since the one before it,
-- in (xid, position) order, and keeps their positions and hashes: a Merkle
-- root over them goes into the checkpoint's hash, which chains to the previous
-- checkpoint's. A head exported out of the database (`qforge audit head`) then
-- pins every event below it: whoever rewrites, drops or adds an event, even
-- with the log's triggers off, has to rewrite the checkpoints as well, and the
-- exported head no longer matches. The leaves are kept (32 + 8 bytes an event)
-- so that `qforge audit verify` names the very position that changed, and so
-- that a proof for one execution needs no other events.
-- The encoding of the hash is in docs/ARCHITECTURE.md (qforge.events.audit).
CREATE TABLE audit_checkpoints (
    seq             bigint      PRIMARY KEY CHECK (seq > 0),
    created_at      timestamptz NOT NULL,
    -- The last event covered, in the gapless reader's order: the next
    -- checkpoint starts after it.
    cursor_xid      xid8        NOT NULL,
    cursor_position bigint      NOT NULL,
    events          integer     NOT NULL CHECK (events > 0),
    -- The covered events in (xid, position) order: positions, and hashes
    -- (32 bytes each, concatenated).
    positions       bigint[]    NOT NULL,
    hashes          bytea       NOT NULL,
    root            bytea       NOT NULL CHECK (octet_length(root) = 32),
    prev            bytea                CHECK (octet_length(prev) = 32),
    hash            bytea       NOT NULL CHECK (octet_length(hash) = 32)
);
-- The leaves are read whole or not at all; hashes do not compress.
ALTER TABLE audit_checkpoints ALTER COLUMN hashes SET STORAGE EXTERNAL;
-- A proof looks up the checkpoint that covers an event: the first whose cursor
-- is at or after the event's (xid, position).
CREATE INDEX audit_checkpoints_cursor ON audit_checkpoints (cursor_xid, cursor_position);
