-- A publish's refusals raised by the server (issue 32: one round trip less a publish over a slow link). A single
-- publish used to read its tasks and its charged totals before sending COMMIT, to refuse a version no profile
-- would index or one over a quota; publish_refusals (sql/queries/storage.sql) now makes the same checks in the
-- transaction, sent with COMMIT, and this function raises SQLSTATE KB001 with the reason as its message and the
-- tenant's totals as its detail, so the transaction aborts and COMMIT is never carried out.
CREATE FUNCTION kbindex_refuse(reason text, stored_bytes bigint, live_versions bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF reason IS NULL THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'KB001', MESSAGE = reason, DETAIL = stored_bytes || ' ' || live_versions;
END
$$;
