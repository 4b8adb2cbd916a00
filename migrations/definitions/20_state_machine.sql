-- Lookups in the state machine. The table itself is app/events/states.py,
-- installed as the IMMUTABLE constant state_machine() (a generated definition
-- applied before this file), so a lookup is a jsonb probe, not a query.

-- The fold's check: the status an event leads to; raises on an illegal transition.
CREATE OR REPLACE FUNCTION state_next(p_machine text, p_from text, p_event text, p_wanted text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    targets jsonb := state_machine() -> p_machine -> (coalesce(p_from, '') || '/' || p_event);
BEGIN
    IF targets IS NOT NULL THEN
        IF p_wanted IS NULL AND jsonb_array_length(targets) = 1 THEN
            RETURN targets ->> 0;
        ELSIF p_wanted IS NOT NULL AND targets ? p_wanted THEN
            RETURN p_wanted;
        END IF;
    END IF;
    RAISE EXCEPTION 'illegal % transition: % on status "%" (wanted %)',
        p_machine, p_event, coalesce(p_from, ''), coalesce(p_wanted, '-')
        USING ERRCODE = 'check_violation';
END $$;

-- Guards used by the command statements: may an event of this type happen now?
-- A NULL status is a stream that does not exist yet, as in Python's allows().
CREATE OR REPLACE FUNCTION state_allows(p_machine text, p_from text, p_event text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(state_machine() -> p_machine ? (coalesce(p_from, '') || '/' || p_event), false)
$$;
