-- The audit's checkpoints are append-only like the log (for every role,
-- superusers included): a checkpoint, once written, is what an exported head
-- vouches for. Migration 0008 made the table; qforge.audit.checkpoints writes it.
CREATE OR REPLACE TRIGGER audit_checkpoints_no_update_delete BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION events_refuse_change('audit_checkpoints');
CREATE OR REPLACE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change('audit_checkpoints');
