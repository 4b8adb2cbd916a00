-- Two shapes of statement trigger that several definitions install, each
-- written once here (the definitions after this one call them).

-- A fold of the log: after every INSERT into events, p_function() reads the
-- statement's new rows as the transition table new_events (30_fold: the only
-- one, which calls the other folds). Replay puts each such trigger on its feed
-- table too (replay_fold_triggers, app/sql/replay.sql), so it folds the same.
CREATE OR REPLACE FUNCTION events_fold_with(p_trigger text, p_function text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT ON events REFERENCING NEW TABLE AS new_events'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION %I()', p_trigger, p_function);
END $$;

-- A projection of jobs kept from the rows each statement changes (35_counters):
-- triggers <p_name>_insert, _update and _delete call the functions of
-- the same names, which read the rows as new_jobs (insert, update) and
-- old_jobs (update, delete).
CREATE OR REPLACE FUNCTION jobs_kept_by(p_name text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE OR REPLACE TRIGGER %1$I AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_jobs'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION %1$I()', p_name || '_insert');
    EXECUTE format('CREATE OR REPLACE TRIGGER %1$I AFTER UPDATE ON jobs'
                   ' REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION %1$I()', p_name || '_update');
    EXECUTE format('CREATE OR REPLACE TRIGGER %1$I AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_jobs'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION %1$I()', p_name || '_delete');
END $$;
