-- The sensor's claim also takes REINDEX tasks that were already attempted (attempts > 0): a backfill
-- run tried them and failed retryably, its run crashed, or a person retried them by hand. No backfill
-- comes back for those, so they are due work like any INDEX task. Never-attempted REINDEX backlog is
-- still left to the operator's backfill and stays out of this index, so a migration never crowds out
-- live indexing. The predicate is exactly the one task_claim's due path walks.
DROP INDEX index_task_due_idx;
CREATE INDEX index_task_due_idx ON index_task (next_attempt_at)
    WHERE status IN ('PENDING', 'RETRY_WAIT') AND (task_type = 'INDEX' OR attempts > 0);
