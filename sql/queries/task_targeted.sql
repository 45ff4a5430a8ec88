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

-- name: task_claim_one
-- Lease one named task now (operator runs do not wait for next_attempt_at): PENDING, RETRY_WAIT, or
-- RUNNING with an expired lease; same transition and event as task_claim, DEAD when out of attempts.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
picked AS (
    SELECT t.task_id, t.status, t.attempts, t.max_attempts, t.lease_unstarted
    FROM index_task t
    WHERE t.task_id = %(task_id)s
      AND (t.status IN ('PENDING', 'RETRY_WAIT')
           OR (t.status = 'RUNNING' AND t.lease_until <= (SELECT now FROM clock)))
    FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE index_task t
    SET status        = CASE WHEN exhausted THEN 'DEAD' ELSE 'RUNNING' END,
        attempts      = CASE WHEN exhausted THEN t.attempts ELSE t.attempts + 1 END,
        -- an expired lease no run ever adopted was never tried: its attempt is given back
        max_attempts  = CASE WHEN p.status = 'RUNNING' AND p.lease_unstarted THEN t.max_attempts + 1
                             ELSE t.max_attempts END,
        lease_unstarted = false,
        lease_owner   = CASE WHEN exhausted THEN NULL ELSE %(owner)s END,
        lease_until   = CASE WHEN exhausted THEN NULL
                             ELSE (SELECT now FROM clock) + make_interval(secs => %(lease_seconds)s) END,
        error_code    = CASE WHEN exhausted THEN 'LEASE_ATTEMPTS_EXHAUSTED' ELSE t.error_code END,
        error_message = CASE WHEN exhausted THEN 'the lease expired and no attempts are left'
                             ELSE t.error_message END,
        finished_at   = CASE WHEN exhausted THEN (SELECT now FROM clock) ELSE NULL END,
        started_at    = (SELECT now FROM clock),
        stage = NULL, completed = 0, total = 0,
        updated_at    = (SELECT now FROM clock)
    FROM (SELECT p.*, (p.status = 'RUNNING' AND p.attempts >= p.max_attempts AND NOT p.lease_unstarted) AS exhausted
          FROM picked p) p
    WHERE t.task_id = p.task_id
    RETURNING t.task_id, p.status AS from_status, t.status, t.attempts, t.lease_owner, t.lease_until,
              t.error_code, t.tenant_id, t.document_id, t.version_number, t.profile, t.task_type
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, lease_owner, error_code, message, created_at)
    SELECT m.task_id, 'transition', m.attempts, m.from_status, m.status, %(owner)s, m.error_code,
           'claimed by an operator-launched run', (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.attempts, m.lease_owner, m.lease_until, m.tenant_id, m.document_id,
       m.version_number, m.profile, m.task_type
FROM moved m
WHERE m.status = 'RUNNING';
