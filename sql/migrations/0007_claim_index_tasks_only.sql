-- The claiming sensor takes INDEX tasks (live publishes) only; REINDEX tasks of a profile being built
-- are claimed by the operator's Dagster backfill (by task id), so a migration never crowds out live
-- indexing. The due index covers exactly what the sensor's claim walks.
DROP INDEX index_task_due_idx;
CREATE INDEX index_task_due_idx ON index_task (next_attempt_at)
    WHERE status IN ('PENDING', 'RETRY_WAIT') AND task_type = 'INDEX';
