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

-- A retry policy per job (a stored definition's retry_policy reaches its steps
-- this way); NULL: the QFORGE_BACKOFF_* settings.
ALTER TABLE jobs ADD COLUMN backoff_base_seconds float8, ADD COLUMN backoff_cap_seconds float8;

-- Stored definitions: a versioned workflow document per name, folded from the
-- `definition` stream's DefinitionStored events (definitions/60_definitions.sql).
-- `definitions` is the head of each name's stream (its version and hash chain
-- head, as jobs and workflows rows are); `definition_versions` every version.
-- Keyed by the stream id (replay compares projections by id; the id is
-- uuid5 of the name, qforge.commands.definitions.stream_id).
CREATE TABLE definitions (
    id            uuid PRIMARY KEY,
    name          text        NOT NULL UNIQUE,
    version       integer     NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    last_position bigint      NOT NULL,
    chain         bytea       NOT NULL
);
CREATE TABLE definition_versions (
    id         uuid        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    document   jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    actor      text        NOT NULL,
    PRIMARY KEY (id, version)
);

-- Each workflow records the definition version it ran (when it came from one).
ALTER TABLE workflows ADD COLUMN definition_name text, ADD COLUMN definition_version integer;

-- Sub-workflows: a child names the step of its parent that started it (and
-- how deeply it is nested, which bounds a definition that starts itself).
ALTER TABLE workflows ADD COLUMN parent_workflow_id uuid, ADD COLUMN parent_job_id uuid,
                      ADD COLUMN parent_step text, ADD COLUMN nesting integer;
CREATE INDEX workflows_parent ON workflows (parent_workflow_id) WHERE parent_workflow_id IS NOT NULL;
CREATE INDEX workflows_parent_job ON workflows (parent_job_id) WHERE parent_job_id IS NOT NULL;
