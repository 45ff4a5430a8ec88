-- Dagster runs of index tasks (pipelines/sensors.py): planning inputs, crashed runs, hung runs.
-- A run is known here only by the leases its tags name: [[task_id, attempt], ...] under one owner.

-- name: run_plan_inputs
-- What the claiming sensor needs to batch the tasks given, in the order given: partition key, byte
-- size (runs are balanced by bytes) and the crash-bisection cap on the task's run size (NULL: none).
SELECT t.task_id, v.partition_key, v.byte_size, t.run_size_cap
FROM unnest(%(task_ids)s::bigint[]) WITH ORDINALITY AS ids(task_id, ord)
JOIN index_task t ON t.task_id = ids.task_id
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
ORDER BY ids.ord;

-- name: run_fail_crashed
-- Run-failure sensor: fail every lease of a crashed run that is still RUNNING on its attempt, whoever
-- holds it, in one statement. The suspects are those rows. With n > 1 suspects the crash cannot be
-- blamed on one document: a suspect gets its attempt back (max_attempts + 1) and its next run is capped
-- at greatest(1, n / 2) tasks, so the retries bisect the batch. The grant is made only when it lowers
-- the task's cap, so a task is granted at most log2(n) + 1 attempts. A lone suspect's attempt counts:
-- a poison document ends DEAD after its attempts while its batch-mates succeed. A lease the run never
-- adopted (it died before starting: lease_unstarted) was never tried: its attempt is given back too.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.task_id, l.attempt
    FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[]) AS l (task_id, attempt)
),
suspects AS (
    SELECT t.task_id, t.run_size_cap, t.lease_unstarted
    FROM index_task t
    JOIN leases l ON l.task_id = t.task_id AND t.attempts = l.attempt
    WHERE t.status = 'RUNNING'
    ORDER BY t.task_id
    FOR UPDATE OF t
),
verdict AS (
    SELECT s.task_id, n.n, s.lease_unstarted AS unstarted,
           (n.n > 1 AND greatest(1, n.n / 2) < coalesce(s.run_size_cap, n.n)) AS granted
    FROM suspects s, (SELECT count(*)::int AS n FROM suspects) n
),
moved AS (
    UPDATE index_task t
    SET max_attempts    = t.max_attempts + CASE WHEN v.granted OR v.unstarted THEN 1 ELSE 0 END,
        lease_unstarted = false,
        run_size_cap    = CASE WHEN v.granted THEN greatest(1, v.n / 2) ELSE t.run_size_cap END,
        status          = CASE WHEN %(retryable)s AND (t.attempts < t.max_attempts OR v.granted OR v.unstarted)
                               THEN 'RETRY_WAIT' ELSE 'DEAD' END,
        next_attempt_at = CASE WHEN %(retryable)s AND (t.attempts < t.max_attempts OR v.granted OR v.unstarted)
                               THEN (SELECT now FROM clock) ELSE t.next_attempt_at END,
        finished_at     = CASE WHEN %(retryable)s AND (t.attempts < t.max_attempts OR v.granted OR v.unstarted)
                               THEN NULL ELSE (SELECT now FROM clock) END,
        lease_owner     = NULL,
        lease_until     = NULL,
        error_code      = %(code)s,
        error_message   = CASE WHEN v.granted
                               THEN %(message)s || ' (one of ' || v.n || ' tasks in the run: attempt not'
                                    || ' counted; its next run has at most ' || greatest(1, v.n / 2) || ')'
                               ELSE %(message)s END,
        updated_at      = (SELECT now FROM clock)
    FROM verdict v
    WHERE t.task_id = v.task_id
    RETURNING t.task_id, t.status, t.attempts, t.stage, t.run_size_cap, t.error_message
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, error_code, message, created_at)
    SELECT m.task_id, 'transition', m.attempts, 'RUNNING', m.status, m.stage, %(code)s, m.error_message,
           (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.status, m.run_size_cap FROM moved m ORDER BY m.task_id;

-- name: run_leases_lost
-- The runs (by index into the arrays) that hold none of their tagged leases any more and lost at least
-- one: taken over (attempts moved on, or another owner) or expired while RUNNING on their attempt (no
-- heartbeat). A run's lease is held under the claiming sensor's owner (%(owners)s) until the run adopts
-- it, then under the run's own owner (%(run_owners)s). A lease the run finished itself (SUCCEEDED,
-- failed, cancelled on its attempt) is neither held nor lost, so a run finishing normally is never
-- reported.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.run_ix, l.task_id, l.attempt, l.owner, l.run_owner
    FROM unnest(%(run_ixs)s::integer[], %(task_ids)s::bigint[], %(attempts)s::integer[], %(owners)s::text[],
                %(run_owners)s::text[]) AS l (run_ix, task_id, attempt, owner, run_owner)
),
judged AS (
    SELECT l.run_ix,
           coalesce(t.status = 'RUNNING' AND t.attempts = l.attempt AND t.lease_owner IN (l.owner, l.run_owner)
                    AND t.lease_until > (SELECT now FROM clock), false) AS held,
           coalesce(t.attempts <> l.attempt
                    OR (t.status = 'RUNNING' AND (t.lease_owner NOT IN (l.owner, l.run_owner)
                                                  OR t.lease_until <= (SELECT now FROM clock))), true) AS lost
    FROM leases l
    LEFT JOIN index_task t ON t.task_id = l.task_id
)
SELECT j.run_ix
FROM judged j
GROUP BY j.run_ix
HAVING NOT bool_or(j.held) AND bool_or(j.lost)
ORDER BY j.run_ix;
