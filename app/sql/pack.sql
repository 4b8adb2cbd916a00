-- qforge pack: closed partitions of the log packed into compressed blocks in
-- the database (app/log/pack.py; the functions are log_pack_* in
-- migrations/definitions/52_log_pack.sql).

-- name: pack_candidates
-- The live partitions packing may take: closed below the settled horizon (see
-- archive_settle_lock) and ending `keep` positions or more before the next
-- append's, not archived, oldest first.
SELECT lower, upper FROM log_pack_candidates(%(horizon)s, %(keep)s)

-- name: pack_begin
SELECT log_pack_begin(%(lower)s) AS filled_to, log_pack_block() AS block

-- name: pack_partition_extent
-- How many events the live partition holds and where they end (a closed
-- partition: nothing is added to it any more).
SELECT count(*) AS events, max(position) AS last_position FROM {partition}

-- name: pack_fill
SELECT log_pack_fill(%(lower)s, %(up_to)s) AS events

-- name: pack_lock_timeout
-- The swap waits this long at most for each of its locks, then gives up and is
-- tried again: a waiting ACCESS EXCLUSIVE request holds up every later reader
-- and appender of the log while it waits.
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: pack_finish
SELECT log_pack_finish(%(lower)s, %(events)s)

-- name: pack_indexes
SELECT log_pack_indexes(%(lower)s) AS statement

-- name: pack_make_index
SELECT log_pack_make_index(%(lower)s, %(statement)s)

-- name: pack_due
-- Whether a partition may be ready for packing (no lock: pack() settles it).
SELECT EXISTS (SELECT FROM log_pack_candidates(log_next_position(), %(keep)s)) AS due
