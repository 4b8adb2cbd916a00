-- Keep the claim index lean on a large, busy jobs table. Every transition of
-- a job leaves a dead tuple (and a dead entry in jobs_claim); with the default
-- scale factor (20 % of the table) a table holding 10M finished jobs is not
-- vacuumed until 2M dead rows pile up, and claims walk dead index entries:
-- measured 17 % more claim CPU per job on a 10M-job history after six drain
-- rounds, 11 % after a VACUUM (bench/run.py --parts claim). Vacuum after a
-- fixed number of changes instead, whatever the table's size.
ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0,
                      autovacuum_vacuum_threshold = 10000,
                      autovacuum_analyze_scale_factor = 0.02);

-- The dead-letter list (GET /jobs?status=dead, the dashboard's queue page)
-- must not walk the whole history: dead jobs are few, so is this index, and
-- only the transition into dead writes to it.
CREATE INDEX jobs_dead ON jobs (id) WHERE status = 'dead';
