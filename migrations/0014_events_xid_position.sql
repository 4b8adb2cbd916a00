-- The gapless reader pages the log in (xid, position) order (events_after,
-- events_tail_cursor). With an index on xid alone, a transaction that wrote
-- many events (the 0.1.0 upgrade's conversion of the whole log, a bulk
-- import) had every page of 500 sort all of that transaction's events, so a
-- catch-up over it took time quadratic in its size. On (xid, position) each
-- page is a range scan. The build locks appends out for as long as it takes
-- (about a second per million events here); on a very large log, run the
-- upgrade in a quiet moment.
CREATE INDEX events_xid_position ON events (xid, position);
DROP INDEX events_xid;
