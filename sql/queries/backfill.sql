-- Profile backfills run by the claiming sensor, and the bounded set of Dagster partition keys.

-- name: index_profile_request_backfill
-- Ask for a building profile's backfill (idempotent); returns its never-attempted REINDEX backlog.
WITH requested AS (
    UPDATE index_profile p
    SET backfill_requested_at = coalesce(p.backfill_requested_at, now())
    WHERE p.name = %(name)s AND p.building
    RETURNING p.name, p.backfill_requested_at
)
SELECT r.name, r.backfill_requested_at,
       (SELECT count(*) FROM index_task t
         WHERE t.profile = r.name AND t.task_type = 'REINDEX' AND t.status = 'PENDING' AND t.attempts = 0)
           AS backlog
FROM requested r;

-- name: task_backfill_sizes
-- The byte sizes of the next %(limit)s backlog tasks task_claim (source backfill) would take, in its order, without
-- locking (the claiming sensor sizes its claim by bytes). Same index walk: O(limit).
SELECT v.byte_size
FROM index_profile p
CROSS JOIN LATERAL (
    SELECT t.tenant_id, t.document_id, t.version_number
    FROM index_task t
    WHERE t.profile = p.name AND t.task_type = 'REINDEX' AND t.status = 'PENDING' AND t.attempts = 0
    ORDER BY t.task_id
    LIMIT %(limit)s
) b
JOIN document_version v USING (tenant_id, document_id, version_number)
WHERE p.building AND p.backfill_requested_at IS NOT NULL
LIMIT %(limit)s;

-- name: dagster_partition_key_record
-- Remember that these partition keys were (re)added to Dagster now.
INSERT INTO dagster_partition_key (partition_key, added_at)
SELECT k, now() FROM unnest(%(partition_keys)s::text[]) AS k
ON CONFLICT (partition_key) DO UPDATE SET added_at = EXCLUDED.added_at;

-- name: dagster_partition_key_prunable
-- Up to %(limit)s keys whose version has no task in flight and that are either past the lineage window or
-- older than the newest %(max_keys)s keys (the cap: the UI's partition pages cost what the live keys cost,
-- so heavy churn cannot make them slow), oldest first. The cap is one walk of the added_at index, O(max_keys).
WITH cap AS (
    SELECT added_at FROM dagster_partition_key ORDER BY added_at DESC OFFSET %(max_keys)s LIMIT 1
)
SELECT k.partition_key
FROM dagster_partition_key k
WHERE k.added_at <= greatest(coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_seconds)s),
                             coalesce((SELECT added_at FROM cap), '-infinity'))
  AND NOT EXISTS (
      SELECT 1
      FROM document_version v
      JOIN index_task t USING (tenant_id, document_id, version_number)
      WHERE v.partition_key = k.partition_key
        AND t.status IN ('PENDING', 'RUNNING', 'RETRY_WAIT'))
ORDER BY k.added_at
LIMIT %(limit)s;

-- name: dagster_partition_key_forget
-- These keys were deleted from Dagster.
DELETE FROM dagster_partition_key WHERE partition_key = ANY(%(partition_keys)s::text[]);

-- name: dagster_partition_key_runs
-- The Dagster runs that worked on the versions with these keys (task_event's lease owners: the runs' adoptions
-- and the claims of UI runs), which prune_lineage_keys deletes once none of their keys is live. Per key: the
-- version by its unique key, its tasks by their business key, their events by task_event_task_idx.
SELECT DISTINCT substr(e.lease_owner, 5) AS run_id
FROM document_version v
JOIN index_task t
  ON t.tenant_id = v.tenant_id AND t.document_id = v.document_id AND t.version_number = v.version_number
JOIN task_event e ON e.task_id = t.task_id
WHERE v.partition_key = ANY(%(partition_keys)s::text[])
  AND e.lease_owner LIKE 'run-%%';

-- name: dagster_partition_key_live
-- Which of these keys Dagster still has (recorded and not pruned).
SELECT partition_key FROM dagster_partition_key WHERE partition_key = ANY(%(partition_keys)s::text[]);

-- name: dagster_partition_key_oldest
-- When the oldest key Dagster still has was added (one end of the added_at index); NULL: none.
SELECT min(added_at) AS added_at FROM dagster_partition_key;

-- name: prune_run_walk_position
-- Where the walk over runs left behind resumes: after runs created at this time (NULL: from the oldest).
SELECT (SELECT after FROM prune_run_walk) AS after;

-- name: prune_run_walk_move
-- The walk looked at runs up to this creation time (NULL: it reached the end; the next starts from the oldest).
INSERT INTO prune_run_walk (walk, after, updated_at) VALUES (true, %(after)s, now())
ON CONFLICT (walk) DO UPDATE SET after = EXCLUDED.after, updated_at = EXCLUDED.updated_at;

-- name: task_dagster_runs
-- The Dagster runs that worked on a task (adoptions, and the claims of UI runs), first attempt first.
SELECT r.run_id, r.attempt, r.created_at
FROM (
    SELECT DISTINCT ON (substr(e.lease_owner, 5)) substr(e.lease_owner, 5) AS run_id, e.attempt, e.created_at
    FROM task_event e
    WHERE e.task_id = %(task_id)s AND e.lease_owner LIKE 'run-%%'
    ORDER BY substr(e.lease_owner, 5), e.event_id
) r
ORDER BY r.created_at;
