-- Workflows written as code (issue 32): the registered function a workflow runs
-- (`code`, its @qforge.workflow name) and the input it was started with. A graph
-- workflow has neither. Both come from WorkflowSubmitted (definitions/30_fold.sql);
-- the function's steps and its journal are jobs of the workflow, as for graphs.
ALTER TABLE workflows ADD COLUMN code text, ADD COLUMN input jsonb;
