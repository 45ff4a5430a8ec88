-- The durable index-task queue (resources/task_queue.py). Every statement takes
-- coalesce(%(now)s::timestamptz, now()) as its one clock so tests can pin time; every
-- transition writes its task_event row in the same statement (data-modifying CTE).
-- Fenced statements change nothing unless
--   status = 'RUNNING' AND lease_owner = me AND attempts = my lease attempt AND lease_until > now
-- (DESIGN.md invariant 2); zero rows back means the caller lost the right to write.
-- How a lease is granted, reserved for a run, adopted, kept alive and given back: lease.sql.

-- name: task_due_sizes
-- The byte sizes of the next %(limit)s due versions, in task_claim's due order (the claiming sensor sizes
-- its claim by bytes, not count). Walks index_task_due_idx like the claim: O(limit), not O(queue).
SELECT v.byte_size
FROM index_task t
JOIN document_version v USING (tenant_id, document_id, version_number)
WHERE t.status IN ('PENDING', 'RETRY_WAIT') AND (t.task_type = 'INDEX' OR t.attempts > 0)
  AND t.next_attempt_at <= now()
ORDER BY t.next_attempt_at
LIMIT %(limit)s;

-- name: task_progress_many
-- Fenced progress of one or many leases of one owner at one stage, in one statement (a run's step
-- announces all its tasks at once): moves stage/completed forward only (stage order, then completed) and
-- logs a progress event per advance. Rows are locked in task-id order; a lease whose fence fails is
-- missing from the rows returned (the caller lost it).
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.task_id, l.attempt, l.completed, l.total
    FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[], %(completeds)s::integer[], %(totals)s::integer[])
         AS l (task_id, attempt, completed, total)
),
cur AS (
    SELECT t.task_id, t.stage, t.completed, t.total, l.completed AS new_completed, l.total AS new_total,
           coalesce(array_position(ARRAY['parse', 'chunk', 'embed', 'publish'], t.stage), 0) AS old_rank,
           array_position(ARRAY['parse', 'chunk', 'embed', 'publish'], %(stage)s::text) AS new_rank
    FROM index_task t
    JOIN leases l ON l.task_id = t.task_id AND l.attempt = t.attempts
    WHERE t.status = 'RUNNING'
      AND t.lease_owner = %(owner)s
      AND t.lease_until > (SELECT now FROM clock)
    ORDER BY t.task_id
    FOR UPDATE OF t
),
moved AS (
    UPDATE index_task t
    SET stage      = CASE WHEN c.new_rank >= c.old_rank THEN %(stage)s::text ELSE c.stage END,
        completed  = CASE WHEN c.new_rank > c.old_rank THEN c.new_completed
                          WHEN c.new_rank = c.old_rank THEN greatest(c.completed, c.new_completed)
                          ELSE c.completed END,
        total      = CASE WHEN c.new_rank >= c.old_rank THEN c.new_total ELSE c.total END,
        updated_at = (SELECT now FROM clock)
    FROM cur c
    WHERE t.task_id = c.task_id
    RETURNING t.task_id, t.attempts, t.stage, t.completed, t.total, t.lease_owner,
              (c.new_rank > c.old_rank OR (c.new_rank = c.old_rank AND c.new_completed > c.completed)
               OR (c.new_rank = c.old_rank AND c.new_completed = c.completed AND c.new_total <> c.total)) AS advanced
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, completed, total,
                            lease_owner, created_at)
    SELECT m.task_id, 'progress', m.attempts, 'RUNNING', 'RUNNING', m.stage, m.completed, m.total,
           m.lease_owner, (SELECT now FROM clock)
    FROM moved m
    WHERE m.advanced
)
SELECT m.task_id, m.attempts, m.advanced FROM moved m;

-- name: task_complete_many
-- Fenced RUNNING -> SUCCEEDED for one or many leases of one owner (one statement, one NOTIFY); a lease
-- that changed nothing is missing from the rows returned: the caller lost it.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.task_id, l.attempt, l.chunk_count
    FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[], %(chunk_counts)s::integer[])
         AS l (task_id, attempt, chunk_count)
),
moved AS (
    UPDATE index_task t
    SET status        = 'SUCCEEDED',
        lease_owner   = NULL,
        lease_until   = NULL,
        chunk_count   = l.chunk_count,
        error_code    = NULL,
        error_message = NULL,
        finished_at   = (SELECT now FROM clock),
        updated_at    = (SELECT now FROM clock)
    FROM leases l
    WHERE t.task_id = l.task_id
      AND t.status = 'RUNNING'
      AND t.lease_owner = %(owner)s
      AND t.attempts = l.attempt
      AND t.lease_until > (SELECT now FROM clock)
    RETURNING t.task_id, t.attempts, t.stage
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, lease_owner, created_at)
    SELECT m.task_id, 'transition', m.attempts, 'RUNNING', 'SUCCEEDED', m.stage, %(owner)s,
           (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id FROM moved m;

-- name: task_completed_check
-- The publish's completion check, sent with COMMIT (waits for nothing): every task the transaction locked RUNNING
-- (task_lock_fenced) must be SUCCEEDED by now (task_complete_many moved it), else the server raises SQLSTATE KB002
-- NOT_COMPLETED (kbindex_publish_abort, migration 0055; detail: task id, its status) and the transaction aborts.
-- Under the row locks only a lease that ran out between the lock and the completion can trip it.
SELECT bool_and(kbindex_publish_abort(CASE WHEN t.status <> 'SUCCEEDED' THEN 'NOT_COMPLETED' END,
                                      t.task_id, t.status)) AS ok
FROM index_task t
WHERE t.task_id = ANY(%(task_ids)s::bigint[]);

-- name: task_fail
-- Fenced RUNNING -> RETRY_WAIT (retryable, attempts left; due after %(delay_seconds)s) or DEAD.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
moved AS (
    UPDATE index_task t
    SET status          = CASE WHEN %(retryable)s AND t.attempts < t.max_attempts
                               THEN 'RETRY_WAIT' ELSE 'DEAD' END,
        next_attempt_at = CASE WHEN %(retryable)s AND t.attempts < t.max_attempts
                               THEN (SELECT now FROM clock) + make_interval(secs => %(delay_seconds)s)
                               ELSE t.next_attempt_at END,
        finished_at     = CASE WHEN %(retryable)s AND t.attempts < t.max_attempts
                               THEN NULL ELSE (SELECT now FROM clock) END,
        lease_owner     = NULL,
        lease_until     = NULL,
        error_code      = %(code)s,
        error_message   = %(message)s,
        updated_at      = (SELECT now FROM clock)
    WHERE t.task_id = %(task_id)s
      AND t.status = 'RUNNING'
      AND t.lease_owner = %(owner)s
      AND t.attempts = %(attempt)s
      AND t.lease_until > (SELECT now FROM clock)
    RETURNING t.task_id, t.status, t.attempts, t.stage, t.next_attempt_at
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, lease_owner,
                            error_code, message, created_at)
    SELECT m.task_id, 'transition', m.attempts, 'RUNNING', m.status, m.stage, %(owner)s,
           %(code)s, %(message)s, (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.status, m.next_attempt_at FROM moved m;

-- name: task_lock_fenced
-- Lock the callers' task rows for their publish transaction (one or many leases of one owner), in task-id
-- order, only where the fence holds; a lease missing from the rows returned was lost.
SELECT t.*
FROM index_task t
JOIN unnest(%(task_ids)s::bigint[], %(attempts)s::integer[]) AS l (task_id, attempt)
  ON l.task_id = t.task_id AND l.attempt = t.attempts
WHERE t.status = 'RUNNING'
  AND t.lease_owner = %(owner)s
  AND t.lease_until > coalesce(%(now)s::timestamptz, now())
ORDER BY t.task_id
FOR UPDATE OF t;

-- name: task_fence_state
-- Why a fenced write changed nothing: the task's status, attempt, owner and lease versus the clock.
SELECT t.task_id, t.status, t.attempts, t.lease_owner, t.lease_until,
       t.lease_until <= coalesce(%(now)s::timestamptz, now()) AS lease_expired
FROM index_task t
WHERE t.task_id = %(task_id)s;

-- name: task_cancel
-- PENDING, RETRY_WAIT or RUNNING -> CANCELLED with its event; no row back means refused or not found.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
-- Lock first so the event records the status it really left (another statement may be moving it).
cur AS (
    SELECT t.task_id, t.status, t.attempts, t.lease_owner, t.stage
    FROM index_task t
    WHERE t.task_id = %(task_id)s
      AND t.status IN ('PENDING', 'RETRY_WAIT', 'RUNNING')
    FOR UPDATE
),
moved AS (
    UPDATE index_task t
    SET status      = 'CANCELLED',
        lease_owner = NULL,
        lease_until = NULL,
        finished_at = (SELECT now FROM clock),
        updated_at  = (SELECT now FROM clock)
    FROM cur c
    WHERE t.task_id = c.task_id
    RETURNING t.task_id, c.status AS from_status, c.attempts, c.lease_owner, c.stage
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, lease_owner, created_at)
    SELECT m.task_id, 'transition', m.attempts, m.from_status, 'CANCELLED', m.stage, m.lease_owner,
           (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.from_status FROM moved m;

-- name: task_retry
-- Manual retry: DEAD or CANCELLED -> PENDING on the same row, attempts kept (the fencing token only
-- grows), %(extra_attempts)s more granted from the current attempt. Never a task of an erased content version
-- (migration 0031): its bytes are gone, and a blob shared with another document must not be indexed back.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
-- Lock first so the event records the status it really left (a cancel or publish may be moving it).
cur AS (
    SELECT t.task_id, t.status
    FROM index_task t
    WHERE t.task_id = %(task_id)s
      AND t.status IN ('DEAD', 'CANCELLED')
      AND NOT EXISTS (SELECT 1 FROM document_version v
                      WHERE v.tenant_id = t.tenant_id AND v.document_id = t.document_id
                        AND v.version_number = t.version_number AND v.kind = 'content' AND v.erased_at IS NOT NULL)
    FOR UPDATE
),
moved AS (
    UPDATE index_task t
    SET status          = 'PENDING',
        max_attempts    = t.attempts + %(extra_attempts)s,
        next_attempt_at = (SELECT now FROM clock),
        finished_at     = NULL,
        updated_at      = (SELECT now FROM clock)
    FROM cur c
    WHERE t.task_id = c.task_id
    RETURNING t.task_id, c.status AS from_status, t.attempts, t.error_code
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, error_code, message, created_at)
    SELECT m.task_id, 'transition', m.attempts, m.from_status, 'PENDING', m.error_code, 'manual retry',
           (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.from_status FROM moved m;

-- name: task_get
-- One task by id, with its version's kind ('tombstone': the task deletes the document), when it was erased, its
-- metadata and its allow list (NULL: the whole tenant may read it).
SELECT t.*, v.kind AS version_kind, v.erased_at AS version_erased_at, v.metadata AS version_metadata,
       v.allow_principals AS version_allow
FROM index_task t
LEFT JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE t.task_id = %(task_id)s;

-- name: task_get_many
-- The tasks of these ids (a run reads all of its tasks at once), with their version's kind; missing ids have
-- no row.
SELECT t.*, v.kind AS version_kind
FROM index_task t
LEFT JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE t.task_id = ANY(%(task_ids)s::bigint[]);

-- name: task_list
-- Newest tasks first, optionally of one status and/or tenant, with their version's kind (one key probe each).
SELECT t.*, v.kind AS version_kind
FROM index_task t
LEFT JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE (%(status)s::text IS NULL OR t.status = %(status)s::text)
  AND (%(tenant)s::text IS NULL OR t.tenant_id = %(tenant)s::text)
ORDER BY t.task_id DESC
LIMIT %(limit)s;

-- name: task_events
-- A task's history after a given event id (SSE resume), oldest first.
SELECT e.*
FROM task_event e
WHERE e.task_id = %(task_id)s
  AND e.event_id > %(after_event_id)s
ORDER BY e.event_id;

-- name: task_stats
-- Queue health in one round trip; each part reads an index, not the whole table.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
SELECT
    (SELECT count(*) FROM index_task t
      WHERE t.status IN ('PENDING', 'RETRY_WAIT') AND t.next_attempt_at <= (SELECT now FROM clock)) AS due_now,
    (SELECT extract(epoch FROM (SELECT now FROM clock) - min(t.next_attempt_at))::float8 FROM index_task t
      WHERE t.status IN ('PENDING', 'RETRY_WAIT') AND t.next_attempt_at <= (SELECT now FROM clock))
        AS oldest_due_age_seconds,
    (SELECT count(*) FROM index_task t WHERE t.status = 'RUNNING') AS running,
    (SELECT count(*) FROM index_task t
      WHERE t.status = 'RUNNING' AND t.lease_until > (SELECT now FROM clock)
        AND t.lease_until <= (SELECT now FROM clock) + interval '1 minute') AS expiring_within_minute,
    (SELECT count(*) FROM index_task t
      WHERE t.status = 'RUNNING' AND t.lease_until <= (SELECT now FROM clock)) AS expired_leases,
    (SELECT count(*) FROM index_task t WHERE t.status = 'RETRY_WAIT') AS retry_waiting,
    (SELECT count(*) FROM index_task t WHERE t.status = 'PENDING') AS pending,
    (SELECT count(*) FROM index_task t WHERE t.status = 'SUCCEEDED') AS succeeded,
    (SELECT count(*) FROM index_task t WHERE t.status = 'CANCELLED') AS cancelled,
    (SELECT count(*) FROM index_task t WHERE t.status = 'DEAD') AS dead,
    (SELECT coalesce(jsonb_object_agg(d.code, d.n), '{}'::jsonb)
       FROM (SELECT coalesce(t.error_code, 'UNKNOWN') AS code, count(*) AS n
               FROM index_task t WHERE t.status = 'DEAD' GROUP BY 1) d) AS dead_by_code;

-- name: task_bench_load_versions
-- Benchmark/test only: versions %(first)s .. %(first)s + %(count)s - 1 of one document, in one statement.
WITH doc AS (
    INSERT INTO document (tenant_id, document_id, latest_version)
    VALUES (%(tenant)s, %(document)s, %(first)s::int + %(count)s::int - 1)
    ON CONFLICT (tenant_id, document_id) DO UPDATE SET latest_version = excluded.latest_version
    RETURNING tenant_id, document_id
)
INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size,
                              filename, media_type, partition_key)
SELECT d.tenant_id, d.document_id, g, 'bench-' || g, 0, 'bench.txt', 'text/plain',
       d.tenant_id || '/' || d.document_id || '/v' || g
FROM doc d, generate_series(%(first)s::int, %(first)s::int + %(count)s::int - 1) AS g;

-- name: task_bench_load_tasks
-- Benchmark/test only: one PENDING task per version in the range (run task_bench_analyze first).
INSERT INTO index_task (tenant_id, document_id, version_number, profile, next_attempt_at)
SELECT %(tenant)s, %(document)s, g, %(profile)s, coalesce(%(now)s::timestamptz, now())
FROM generate_series(%(first)s::int, %(first)s::int + %(count)s::int - 1) AS g;

-- name: task_bench_analyze
-- Benchmark/test only: fresh statistics, so the foreign-key checks of a bulk load use the primary key.
ANALYZE document_version, index_task;

-- name: task_bench_vacuum
-- Benchmark only: settle a freshly loaded queue (visibility map, statistics) before measuring.
VACUUM ANALYZE document_version, index_task, task_event;

-- name: task_bench_requeue
-- Benchmark only: put finished tasks back as PENDING so the queue keeps its depth (a steady publish rate).
UPDATE index_task t
SET status = 'PENDING', next_attempt_at = now(), finished_at = NULL, updated_at = now()
WHERE t.task_id = ANY(%(task_ids)s::bigint[])
  AND t.status = 'SUCCEEDED';
