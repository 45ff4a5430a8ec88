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
-- The byte sizes of the next %(limit)s backlog tasks task_claim_backfill would take, in its order, without
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

-- name: task_claim_backfill
-- Lease up to %(limit)s never-attempted REINDEX tasks of profiles whose backfill was requested, oldest
-- task first, in one statement (same transition and event as task_claim). Walks
-- index_task_reindex_backlog_idx per requested profile; SKIP LOCKED as the claim does.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
picked AS (
    SELECT b.task_id
    FROM index_profile p
    CROSS JOIN LATERAL (
        SELECT t.task_id
        FROM index_task t
        WHERE t.profile = p.name AND t.task_type = 'REINDEX' AND t.status = 'PENDING' AND t.attempts = 0
        ORDER BY t.task_id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) b
    WHERE p.building AND p.backfill_requested_at IS NOT NULL
    LIMIT %(limit)s
),
moved AS (
    UPDATE index_task t
    SET status          = 'RUNNING',
        attempts        = t.attempts + 1,
        lease_owner     = %(owner)s,
        lease_until     = (SELECT now FROM clock) + make_interval(secs => %(lease_seconds)s),
        lease_unstarted = %(unstarted)s::boolean,
        started_at      = (SELECT now FROM clock),
        finished_at     = NULL,
        stage = NULL, completed = 0, total = 0,
        updated_at      = (SELECT now FROM clock)
    FROM picked p
    WHERE t.task_id = p.task_id
    RETURNING t.task_id, t.attempts, t.lease_owner, t.lease_until, t.tenant_id, t.document_id,
              t.version_number, t.profile, t.task_type
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, lease_owner, message, created_at)
    SELECT m.task_id, 'transition', m.attempts, 'PENDING', 'RUNNING', %(owner)s,
           'claimed for the backfill of profile ' || m.profile, (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.attempts, m.lease_owner, m.lease_until, m.tenant_id, m.document_id,
       m.version_number, m.profile, m.task_type
FROM moved m
ORDER BY m.task_id;

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
