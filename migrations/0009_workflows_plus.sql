-- Workflows users can live with (issue 15): what a workflow returns, when it
-- must be done, and resume. Nullable columns only, so a 0.1.0 database
-- upgrades in place (PostgreSQL adds them without rewriting the tables).

-- "result": {"step", "path"?} as submitted, and the value it named once the
-- workflow succeeded (WorkflowSucceeded carries it too).
ALTER TABLE workflows ADD COLUMN result_from jsonb, ADD COLUMN result jsonb;

-- "deadline_seconds": the absolute time, fixed when the workflow is submitted
-- (and again when it is resumed). The monitor looks for running workflows
-- past it, so a partial index over just those.
ALTER TABLE workflows ADD COLUMN deadline_seconds float8, ADD COLUMN deadline_at timestamptz;
CREATE INDEX workflows_deadline ON workflows (deadline_at) WHERE status = 'running' AND deadline_at IS NOT NULL;

-- Fan-out ("for_each"): one job per element of a list, each naming the step it
-- belongs to and its index; the step itself waits for them.
ALTER TABLE jobs ADD COLUMN element_of text, ADD COLUMN element_index integer;
