-- The fenced publish's last two checks raised by the server (issue 32: two round trips less a publish over a slow
-- link). The publish used to read each version's row counts, and the tasks its completion moved, before it went
-- on; index_rows_check and task_completed_check (sql/queries/index.sql, task.sql) now make the same checks as
-- statements sent with COMMIT, and this function raises SQLSTATE KB002 with the check's reason as its message and
-- "<task id> <what was found>" as its detail, so the transaction aborts and COMMIT is never carried out.
CREATE FUNCTION kbindex_publish_abort(reason text, task_id bigint, detail text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF reason IS NULL THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'KB002', MESSAGE = reason, DETAIL = task_id || ' ' || coalesce(detail, '');
END
$$;
