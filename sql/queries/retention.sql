-- Statements of resources/retention.py: delete chunks of versions search stopped reading more than a window
-- ago. One transaction per batch: lock the versions' tasks, then their pointers (the publish transaction's
-- order: task row, then pointer), then delete. superseded_version is kept by a trigger on search_pointer
-- (migration 0006) and loses a version's row when its chunks go, so a pass reads the due versions, never
-- every version ever published. Dagster partition keys are pruned by the lineage job alone (sql/queries/backfill.sql).

-- name: retention_lock_timeout
-- Bound how long a retention batch waits for a task or pointer row (a publish transaction is short).
SELECT set_config('lock_timeout', %(lock_timeout)s, true) AS lock_timeout;

-- name: superseded_version_due
-- Versions whose pointer moved away more than the window ago and that no pointer names again, oldest
-- first (superseded_version_due_idx). A plain read: the batch re-checks all of it under locks.
SELECT s.tenant_id, s.document_id, s.profile, s.version_number, s.superseded_at
FROM superseded_version s
WHERE s.superseded_at <= coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_seconds)s::float8)
  AND NOT EXISTS (
      SELECT 1 FROM search_pointer p
      WHERE p.tenant_id = s.tenant_id AND p.document_id = s.document_id
        AND p.profile = s.profile AND p.version_number = s.version_number)
ORDER BY s.superseded_at, s.tenant_id, s.document_id, s.profile, s.version_number
LIMIT %(limit)s;

-- name: index_task_lock_retention
-- Share-lock every task (any profile) of the due versions, in task_id order: until the batch commits no
-- claim can make one RUNNING (the claim's SKIP LOCKED passes it by) and no publish can lock it.
SELECT t.task_id, t.tenant_id, t.document_id, t.version_number, t.profile, t.status
FROM index_task t
JOIN unnest(%(tenant_ids)s::text[], %(document_ids)s::text[], %(versions)s::integer[])
     AS d (tenant_id, document_id, version_number)
  ON t.tenant_id = d.tenant_id AND t.document_id = d.document_id AND t.version_number = d.version_number
ORDER BY t.task_id
FOR SHARE OF t;

-- name: search_pointer_lock_retention
-- Share-lock the pointers of the due versions' documents: no pointer can move back onto a version while
-- its chunks are being deleted (a move locks the row first, then waits for this batch to commit).
SELECT p.tenant_id, p.document_id, p.profile, p.version_number
FROM search_pointer p
JOIN unnest(%(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[])
     AS d (tenant_id, document_id, profile)
  ON p.tenant_id = d.tenant_id AND p.document_id = d.document_id AND p.profile = d.profile
ORDER BY p.tenant_id, p.document_id, p.profile
FOR SHARE OF p;

-- name: chunk_delete_retained
-- Delete the chunks of the due versions that, re-checked under the batch's locks, are still superseded for
-- longer than the window, named by no pointer, and have no RUNNING task under any profile; forget their
-- superseded_version rows. One row back per version removed, with the number of chunk rows deleted.
WITH due AS (
    SELECT *
    FROM unnest(%(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[], %(versions)s::integer[])
         AS d (tenant_id, document_id, profile, version_number)
),
removable AS (
    SELECT d.tenant_id, d.document_id, d.profile, d.version_number
    FROM due d
    JOIN superseded_version s
      ON s.tenant_id = d.tenant_id AND s.document_id = d.document_id
     AND s.profile = d.profile AND s.version_number = d.version_number
    WHERE s.superseded_at <= coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_seconds)s::float8)
      AND NOT EXISTS (
          SELECT 1 FROM search_pointer p
          WHERE p.tenant_id = d.tenant_id AND p.document_id = d.document_id
            AND p.profile = d.profile AND p.version_number = d.version_number)
      AND NOT EXISTS (
          SELECT 1 FROM index_task t
          WHERE t.tenant_id = d.tenant_id AND t.document_id = d.document_id
            AND t.version_number = d.version_number AND t.status = 'RUNNING')
),
deleted AS (
    DELETE FROM chunk c
    USING removable r
    WHERE c.tenant_id = r.tenant_id AND c.document_id = r.document_id
      AND c.profile = r.profile AND c.version_number = r.version_number
    RETURNING c.tenant_id, c.document_id, c.profile, c.version_number
),
forgotten AS (
    DELETE FROM superseded_version s
    USING removable r
    WHERE s.tenant_id = r.tenant_id AND s.document_id = r.document_id
      AND s.profile = r.profile AND s.version_number = r.version_number
    RETURNING s.tenant_id, s.document_id, s.profile, s.version_number
)
SELECT f.tenant_id, f.document_id, f.profile, f.version_number,
       (SELECT count(*) FROM deleted x
        WHERE x.tenant_id = f.tenant_id AND x.document_id = f.document_id
          AND x.profile = f.profile AND x.version_number = f.version_number)::integer AS chunks_deleted
FROM forgotten f
ORDER BY f.tenant_id, f.document_id, f.profile, f.version_number;
