-- The task_event trigger is per statement, and a statement-level AFTER INSERT trigger fires even when the
-- INSERT ... SELECT inserted no row: every claim that found nothing due (its events CTE inserts none) sent
-- NOTIFY kbindex_task_event '0'. The claiming sensor waits on that channel inside its tick, so an idle tick
-- woke itself about every 0.1 s (its wake grace) and claimed some 40 times instead of once, and every SSE hub
-- re-read its streams as often. Now a statement that inserted no event notifies nobody.
CREATE OR REPLACE FUNCTION task_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    newest bigint;
BEGIN
    SELECT max(event_id) INTO newest FROM new_events;
    IF newest IS NOT NULL THEN
        PERFORM pg_notify('kbindex_task_event', newest::text);
    END IF;
    RETURN NULL;
END $$;
