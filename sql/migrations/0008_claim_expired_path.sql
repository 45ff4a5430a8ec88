-- The claim's expired-lease path must walk index_task_lease_idx in lease_until order. With the plain
-- index on status, the planner prefers "all RUNNING rows, then sort" whenever statistics say few tasks
-- are running, which turns into a sort of every running task exactly when many leases expire at once.
-- RUNNING rows are reachable through index_task_lease_idx (same predicate), so the status index
-- leaves them out and no longer competes for that path.
DROP INDEX index_task_status_idx;
CREATE INDEX index_task_status_idx ON index_task (status) WHERE status <> 'RUNNING';
