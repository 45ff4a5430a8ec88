-- Statements for runs launched by an operator (UI backfill, `dagster asset materialize`): they name
-- a version instead of taking the queue's next task, but go through the same lease and fence.

-- name: task_ensure_for_version
-- The task of a version under a profile: the existing one (INDEX or REINDEX), else a new PENDING REINDEX
-- task, but only for the document's current version (a backfill over old partitions builds nothing).
WITH existing AS (
    SELECT task_id FROM index_task
    WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s
      AND version_number = %(version)s AND profile = %(profile)s
    ORDER BY task_type            -- INDEX before REINDEX
    LIMIT 1
),
inserted AS (
    INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, max_attempts)
    SELECT %(tenant_id)s, %(document_id)s, %(version)s, 'REINDEX', %(profile)s, %(max_attempts)s
    WHERE NOT EXISTS (SELECT 1 FROM existing)
      AND %(version)s = (SELECT latest_version FROM document
                         WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s)
    ON CONFLICT (tenant_id, document_id, version_number, task_type, profile) DO NOTHING
    RETURNING task_id
),
created_event AS (
    INSERT INTO task_event (task_id, attempt, from_status, to_status, message)
    SELECT task_id, 0, NULL, 'PENDING', 'created for an operator-launched run'
    FROM inserted
)
SELECT task_id FROM existing
UNION ALL
SELECT task_id FROM inserted;
