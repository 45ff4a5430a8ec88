-- Statements of resources/artifact_sweep.py: which tasks' run artifacts (parsed text, chunks, vectors kept
-- on disk under task-<id> folders) nothing will read again.

-- name: artifact_tasks_ended
-- Of the given task ids, those whose task ended (SUCCEEDED, DEAD, CANCELLED) or no longer exists. An open
-- task (PENDING, RUNNING, RETRY_WAIT) is left out: a run may be writing its artifacts or re-execute from them.
-- A plain read by primary key: a task that is retried after this read only loses reuse, and the sweep keeps
-- files younger than its grace period, so the new run's files stay.
SELECT d.task_id
FROM unnest(%(task_ids)s::bigint[]) AS d (task_id)
LEFT JOIN index_task t ON t.task_id = d.task_id
WHERE t.task_id IS NULL OR t.status NOT IN ('PENDING', 'RUNNING', 'RETRY_WAIT')
ORDER BY d.task_id;
