-- Lookups in the state machine. The table itself is app/events/states.py,
-- installed as the IMMUTABLE constant state_machine() (a generated definition
-- applied before this file), so a lookup is a jsonb probe, not a query. Both
-- functions are plain SQL expressions, inlined into the statements that call
-- them.

-- The status an event leads to from status p_from (NULL: a new stream), or
-- NULL when the table has no such transition. p_wanted is the status the
-- event names when the table leaves the choice to it (Enqueued, StepUnblocked).
-- One probe of state_targets() (generated beside state_machine()), and each
-- parameter used once: the planner inlines it whatever the arguments are.
CREATE OR REPLACE FUNCTION state_target(p_machine text, p_from text, p_event text, p_wanted text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT state_targets() -> p_machine ->> (coalesce(p_from, '') || '/' || p_event || '/' || coalesce(p_wanted, ''))
$$;

-- Guards used by the command statements: may an event of this type happen now?
-- A NULL status is a stream that does not exist yet, as in Python's allows().
CREATE OR REPLACE FUNCTION state_allows(p_machine text, p_from text, p_event text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(state_machine() -> p_machine ? (coalesce(p_from, '') || '/' || p_event), false)
$$;

-- The fold's answer to an event the table does not allow: fail the statement
-- that appended it. Declared IMMUTABLE so that the expressions calling it stay
-- inlinable; it is only reached on the error path, never constant-folded (its
-- arguments are columns).
CREATE OR REPLACE FUNCTION state_refuse(p_machine text, p_from text, p_event text, p_wanted text,
                                        p_stream uuid)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'illegal % transition: % on status "%" (wanted %) in stream %',
        p_machine, p_event, coalesce(p_from, ''), coalesce(p_wanted, '-'), p_stream
        USING ERRCODE = 'check_violation';
END $$;
