-- Status page overview (issue 11, point 7): every figure and every page of the document list is an
-- index walk scoped to one tenant, so the page costs the same with a million tasks as with a thousand.

-- Counts by status (index-only), the oldest open task (first entry per open status) and a keyset walk of
-- one status newest first. Its (tenant_id, status) prefix does the job of index_task_tenant_status_idx.
CREATE INDEX index_task_tenant_status_task_idx ON index_task (tenant_id, status, task_id);
DROP INDEX index_task_tenant_status_idx;

-- Finished tasks by time: the success rate over the last minutes and the work done since the oldest open
-- task was queued are range scans of this index.
CREATE INDEX index_task_tenant_finished_idx ON index_task (tenant_id, status, finished_at)
    WHERE finished_at IS NOT NULL;

-- Failures by error code, and the keyset walk of one code's documents (DEAD or waiting for a retry).
CREATE INDEX index_task_tenant_failure_idx ON index_task (tenant_id, error_code, task_id)
    WHERE status IN ('DEAD', 'RETRY_WAIT');

-- The unfiltered document list, newest publish first, a page at a time.
CREATE INDEX document_version_tenant_published_idx
    ON document_version (tenant_id, published_at, document_id, version_number);
