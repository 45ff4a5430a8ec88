-- A lease's life, from the claim to the run that works under it (resources/task_queue.py has the verbs,
-- pipelines/sensors.py the Dagster side). Every statement takes coalesce(%(now)s::timestamptz, now()) as
-- its one clock so tests can pin time, and writes its task_event rows in the same statement.
--
--   claimed ──(for a run yet to start)──> RESERVED ──adopt──> HELD ──complete / fail──> ended
--      │                                     │                  │
--      └──(worker or operator run)──> HELD   │                  └─ expired (no heartbeat) ─> taken over by a claim:
--                                            │                     the attempt counts
--                                            └─ never adopted: its run never appeared (orphaned), died before
--                                               starting, or the reservation ran out ─> given back: the attempt
--                                               does not count, at most %(giveback_limit)s times, then DEAD
--                                               RUN_NEVER_STARTED
--
-- RESERVED: status RUNNING, lease_reserved, lease_owner = the claiming sensor's tick (batch-...), lease_until =
--   the longest expected queue wait. Nothing writes under a reservation, so nothing heartbeats it; its run
--   adopts it at start even after lease_until, as long as no claim took it over (same owner, same attempt).
-- HELD: lease_owner = the run (run-<run id>) or a worker; heartbeated; every write is fenced on
--   (RUNNING, owner, attempt, lease_until > now) (task.sql).
-- The attempt (the task's attempts at the claim) is the fencing token; it only grows.

-- name: task_claim
-- Lease tasks to %(owner)s in one atomic statement (invariant 1), from one %(source)s:
--   'queue'    due tasks and expired leases, the longest waiting first (the claiming sensor, workers);
--   'expired'  expired leases only (the run queue is full, but nothing may stay RUNNING past its lease);
--   'backfill' never-attempted REINDEX tasks of profiles whose backfill was requested, oldest first;
--   'task'     the one task %(task_id)s, if it is claimable now (operator-launched runs);
--   'fast'     the same, for the fast path (resources/chunk_copy.py: published by the publishing process, no run).
-- %(reserve)s: the lease is a reservation for a run yet to start, lasting %(lease_seconds)s.
-- Fairness ('queue'): up to half of the claim goes first to the oldest due task of each tenant that has due
-- work (tenants in name order, at most %(limit)s / 2 of them; none for a claim of one), the rest by age, so
-- one tenant's bulk backlog does not hold another tenant's task until it drains.
WITH RECURSIVE
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
-- Due work: walk index_task_due_idx (partial on exactly this predicate) in next_attempt_at order and stop
-- after %(limit)s rows, so the cost does not grow with the queue. INDEX tasks, and REINDEX tasks already
-- attempted (no backfill comes back for them); the never-attempted REINDEX backlog is the 'backfill' source.
-- SKIP LOCKED: rows another claimer is taking are passed over instead of waited for.
due AS (
    SELECT t.task_id, t.status, t.attempts, t.max_attempts, t.lease_reserved, t.reservation_givebacks, t.next_attempt_at AS since, false AS head
    FROM index_task t
    WHERE %(source)s::text = 'queue'
      AND t.status IN ('PENDING', 'RETRY_WAIT') AND (t.task_type = 'INDEX' OR t.attempts > 0)
      AND t.next_attempt_at <= (SELECT now FROM clock)
    ORDER BY t.next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
-- The tenants with due-or-waiting work, one index descent each (a loose scan of index_task_tenant_due_idx),
-- at most half the limit of them.
tenant_walk AS (
    (SELECT t.tenant_id, 1 AS n
     FROM index_task t
     WHERE %(source)s::text = 'queue' AND %(limit)s >= 2  -- a claim of one goes by age alone
       AND t.status IN ('PENDING', 'RETRY_WAIT') AND (t.task_type = 'INDEX' OR t.attempts > 0)
     ORDER BY t.tenant_id
     LIMIT 1)
    UNION ALL
    (SELECT nx.tenant_id, w.n + 1
     FROM tenant_walk w
     CROSS JOIN LATERAL (
         SELECT t.tenant_id
         FROM index_task t
         WHERE t.tenant_id > w.tenant_id
           AND t.status IN ('PENDING', 'RETRY_WAIT') AND (t.task_type = 'INDEX' OR t.attempts > 0)
         ORDER BY t.tenant_id
         LIMIT 1
     ) nx
     WHERE w.n < %(limit)s / 2)
),
-- Each of those tenants' oldest due task (none when its work is not due yet, or another claimer holds it).
heads AS (
    SELECT h.*
    FROM tenant_walk w
    CROSS JOIN LATERAL (
        SELECT t.task_id, t.status, t.attempts, t.max_attempts, t.lease_reserved, t.reservation_givebacks,
               t.next_attempt_at AS since, true AS head
        FROM index_task t
        WHERE t.tenant_id = w.tenant_id
          AND t.status IN ('PENDING', 'RETRY_WAIT') AND (t.task_type = 'INDEX' OR t.attempts > 0)
          AND t.next_attempt_at <= (SELECT now FROM clock)
        ORDER BY t.next_attempt_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) h
),
-- Abandoned work: RUNNING tasks whose lease or reservation ran out, oldest first, via index_task_lease_idx.
-- A separate walk because one OR-ed predicate over both would match neither partial index.
expired AS (
    SELECT t.task_id, t.status, t.attempts, t.max_attempts, t.lease_reserved, t.reservation_givebacks, t.lease_until AS since, false AS head
    FROM index_task t
    WHERE %(source)s::text IN ('queue', 'expired')
      AND t.status = 'RUNNING'
      AND t.lease_until <= (SELECT now FROM clock)
    ORDER BY t.lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
-- A model migration's backlog: index_task_reindex_backlog_idx per requested profile.
backlog AS (
    SELECT b.*
    FROM index_profile p
    CROSS JOIN LATERAL (
        SELECT t.task_id, t.status, t.attempts, t.max_attempts, t.lease_reserved, t.reservation_givebacks, t.next_attempt_at AS since, false AS head
        FROM index_task t
        WHERE t.profile = p.name AND t.task_type = 'REINDEX' AND t.status = 'PENDING' AND t.attempts = 0
        ORDER BY t.task_id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) b
    WHERE %(source)s::text = 'backfill' AND p.building AND p.backfill_requested_at IS NOT NULL
    LIMIT %(limit)s
),
-- One named task, whatever its next_attempt_at (an operator asked for it now).
named AS (
    SELECT t.task_id, t.status, t.attempts, t.max_attempts, t.lease_reserved, t.reservation_givebacks, t.next_attempt_at AS since, false AS head
    FROM index_task t
    WHERE %(source)s::text IN ('task', 'fast') AND t.task_id = %(task_id)s::bigint
      AND (t.status IN ('PENDING', 'RETRY_WAIT')
           OR (t.status = 'RUNNING' AND t.lease_until <= (SELECT now FROM clock)))
    FOR UPDATE SKIP LOCKED
),
-- At most 2.5 x limit locked candidates; keep the tenants' heads, then the longest-waiting, up to
-- %(limit)s. The verdict of each:
picked AS (
    SELECT c.task_id, c.status,
           -- a lease some run worked on ran out with no attempts left
           (c.status = 'RUNNING' AND NOT c.lease_reserved AND c.attempts >= c.max_attempts) AS exhausted,
           -- a reservation no run adopted: its attempt was never tried and is given back...
           (c.status = 'RUNNING' AND c.lease_reserved) AS given_back,
           -- ... unless it was given back too often: runs do not start, and somebody must be told
           (c.status = 'RUNNING' AND c.lease_reserved AND c.reservation_givebacks >= %(giveback_limit)s) AS abandoned
    FROM (SELECT DISTINCT ON (u.task_id) u.*  -- a head is also among the due: keep it once, as a head
          FROM (SELECT * FROM heads UNION ALL SELECT * FROM due UNION ALL SELECT * FROM expired
                UNION ALL SELECT * FROM backlog UNION ALL SELECT * FROM named) u
          ORDER BY u.task_id, u.head DESC) c
    ORDER BY c.head DESC, c.since, c.task_id
    LIMIT %(limit)s
),
-- The transition: DEAD (exhausted or abandoned) as bookkeeping, else RUNNING with attempts + 1, the new
-- fencing token.
moved AS (
    UPDATE index_task t
    SET status                = CASE WHEN p.exhausted OR p.abandoned THEN 'DEAD' ELSE 'RUNNING' END,
        attempts              = CASE WHEN p.exhausted OR p.abandoned THEN t.attempts ELSE t.attempts + 1 END,
        max_attempts          = t.max_attempts + CASE WHEN p.given_back AND NOT p.abandoned THEN 1 ELSE 0 END,
        reservation_givebacks = t.reservation_givebacks + CASE WHEN p.given_back AND NOT p.abandoned THEN 1 ELSE 0 END,
        lease_owner           = CASE WHEN p.exhausted OR p.abandoned THEN NULL ELSE %(owner)s END,
        lease_until           = CASE WHEN p.exhausted OR p.abandoned THEN NULL
                                     ELSE (SELECT now FROM clock) + make_interval(secs => %(lease_seconds)s) END,
        lease_reserved        = CASE WHEN p.exhausted OR p.abandoned THEN false ELSE %(reserve)s::boolean END,
        error_code            = CASE WHEN p.exhausted THEN 'LEASE_ATTEMPTS_EXHAUSTED'
                                     WHEN p.abandoned THEN 'RUN_NEVER_STARTED' ELSE t.error_code END,
        error_message         = CASE WHEN p.exhausted THEN 'the lease expired and no attempts are left'
                                     WHEN p.abandoned THEN %(never_started_message)s ELSE t.error_message END,
        finished_at           = CASE WHEN p.exhausted OR p.abandoned THEN (SELECT now FROM clock) ELSE NULL END,
        started_at            = (SELECT now FROM clock),
        stage                 = NULL,
        completed             = 0,
        total                 = 0,
        updated_at            = (SELECT now FROM clock)
    FROM picked p
    WHERE t.task_id = p.task_id
    RETURNING t.task_id, p.status AS from_status, t.status, t.attempts, t.lease_owner, t.lease_until,
              t.error_code, p.given_back AND NOT p.abandoned AS given_back,
              t.tenant_id, t.document_id, t.version_number, t.profile, t.task_type
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, lease_owner, error_code, message,
                            created_at)
    SELECT m.task_id, 'transition', m.attempts, m.from_status, m.status, %(owner)s,
           CASE WHEN m.status = 'DEAD' THEN m.error_code END,
           CASE WHEN m.status = 'DEAD' THEN NULL
                WHEN m.given_back THEN 'the previous reservation was never started: attempt given back'
                WHEN %(source)s::text = 'backfill' THEN 'claimed for the backfill of profile ' || m.profile
                WHEN %(source)s::text = 'task' THEN 'claimed by an operator-launched run'
                WHEN %(source)s::text = 'fast' THEN 'claimed by the fast path: published without a run' END,
           (SELECT now FROM clock)
    FROM moved m
)
-- Only granted leases go back to the caller; the DEAD ones were bookkeeping.
SELECT m.task_id, m.attempts, m.lease_owner, m.lease_until, m.tenant_id, m.document_id,
       m.version_number, m.profile, m.task_type
FROM moved m
WHERE m.status = 'RUNNING'
ORDER BY m.task_id;

-- name: task_adopt
-- A run takes its reservations (all made by the tick %(owner)s): from now on the run (%(run_owner)s) holds
-- them, heartbeats them, and the attempt counts. Accepted while the reservation is unchanged (same owner,
-- same attempt, still reserved), even after its lease_until: until a claim takes it over, nobody else can
-- have it. A re-execution that copied the run's tags finds the lease no longer reserved. Rows back are the
-- leases adopted; a missing one was lost before the run started.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.task_id, l.attempt
    FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[]) AS l (task_id, attempt)
),
moved AS (
    UPDATE index_task t
    SET lease_owner    = %(run_owner)s,
        lease_until    = (SELECT now FROM clock) + make_interval(secs => %(lease_seconds)s),
        lease_reserved = false,
        updated_at     = (SELECT now FROM clock)
    FROM leases l
    WHERE t.task_id = l.task_id
      AND t.status = 'RUNNING'
      AND t.lease_owner = %(owner)s
      AND t.attempts = l.attempt
      AND (t.lease_reserved OR t.lease_until > (SELECT now FROM clock))  -- or a worker's live lease, handed on
    RETURNING t.task_id, t.attempts, t.lease_owner, t.lease_until, t.stage
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, lease_owner, message, created_at)
    SELECT m.task_id, 'run', m.attempts, 'RUNNING', 'RUNNING', m.stage, %(run_owner)s,
           'started by ' || %(run_owner)s || ' (claimed by ' || %(owner)s || ')', (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.attempts, m.lease_owner, m.lease_until FROM moved m ORDER BY m.task_id;

-- name: task_heartbeat
-- Fenced: extend the lease of the caller's attempt; no row back means the lease is lost.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
UPDATE index_task t
SET lease_until = (SELECT now FROM clock) + make_interval(secs => %(lease_seconds)s),
    updated_at  = (SELECT now FROM clock)
WHERE t.task_id = %(task_id)s::bigint
  AND t.status = 'RUNNING'
  AND t.lease_owner = %(owner)s
  AND t.attempts = %(attempt)s
  AND t.lease_until > (SELECT now FROM clock)
RETURNING t.task_id, t.attempts, t.lease_owner, t.lease_until;

-- name: task_heartbeat_many
-- Fenced: extend held leases of %(owner)s in one statement that never waits on a row lock. Each lease comes
-- back once with its outcome: 'renewed' (with the new lease_until); 'busy' (the fence holds but another
-- transaction holds the row: the lease's own publish is in flight; it finishes or fails on its own);
-- 'finished' (SUCCEEDED by this very attempt: only the lease's own publish does that, committed while this
-- heartbeat was on its way, before the run let go of the lease); 'lost' (the fence does not hold; the row's
-- status, attempts, owner and expiry say why, with no further read).
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.task_id, l.attempt
    FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[]) AS l (task_id, attempt)
),
-- Lock the rows whose fence holds; SKIP LOCKED passes over rows being published instead of waiting.
lockable AS (
    SELECT t.task_id
    FROM index_task t
    JOIN leases l ON l.task_id = t.task_id
    WHERE t.status = 'RUNNING'
      AND t.lease_owner = %(owner)s
      AND t.attempts = l.attempt
      AND t.lease_until > (SELECT now FROM clock)
    FOR UPDATE OF t SKIP LOCKED
),
renewed AS (
    UPDATE index_task t
    SET lease_until = (SELECT now FROM clock) + make_interval(secs => %(lease_seconds)s),
        updated_at  = (SELECT now FROM clock)
    FROM lockable k
    WHERE t.task_id = k.task_id
    RETURNING t.task_id, t.attempts, t.lease_until
)
-- Second look, without locking (the statement's snapshot): a row not renewed whose fence holds was skipped
-- for its lock; any other row failed the fence. (A fence broken by a commit during this very statement may
-- read as busy once; the next beat reports it lost.)
SELECT l.task_id, l.attempt, r.lease_until,
       CASE WHEN r.task_id IS NOT NULL THEN 'renewed'
            WHEN f.status = 'RUNNING' AND f.lease_owner = %(owner)s AND f.attempts = l.attempt
                 AND f.lease_until > (SELECT now FROM clock) THEN 'busy'
            WHEN f.status = 'SUCCEEDED' AND f.attempts = l.attempt THEN 'finished'
            ELSE 'lost' END AS outcome,
       f.status, f.attempts AS current_attempt, f.lease_owner AS current_owner,
       f.lease_until <= (SELECT now FROM clock) AS lease_expired
FROM leases l
LEFT JOIN renewed r ON r.task_id = l.task_id AND r.attempts = l.attempt
LEFT JOIN index_task f ON f.task_id = l.task_id;

-- name: lease_expire_orphaned
-- Reservations whose run never appeared: made more than %(grace_seconds)s ago by a tick whose owner no run
-- waiting or working names (%(live_owners)s; the tick died after its claim, or Dagster never created its
-- runs). Their lease_until is set to now, so the next claim takes them over and gives their attempt back.
-- Walks index_task_reserved_idx: reservations are only the runs waiting to start.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
UPDATE index_task t
SET lease_until = (SELECT now FROM clock),
    updated_at  = (SELECT now FROM clock)
WHERE t.status = 'RUNNING' AND t.lease_reserved
  AND t.lease_owner <> ALL (%(live_owners)s::text[])
  AND t.started_at <= (SELECT now FROM clock) - make_interval(secs => %(grace_seconds)s)
  AND t.lease_until > (SELECT now FROM clock)
RETURNING t.task_id, t.lease_owner;

-- name: lease_fail_crashed_run
-- The run-failure sensor: the run (%(run_owner)s, started from the reservations of tick %(owner)s) died
-- without recording an outcome. Only leases still on their attempt *and* still this run's or its tick's are
-- touched (another run may have taken a task over meanwhile). Two kinds:
-- - reserved (never adopted): the run never started them. The attempt is given back (at most
--   %(giveback_limit)s times, then DEAD RUN_NEVER_STARTED) and the task is due again, with no error code:
--   nothing was wrong with the document.
-- - held (adopted): RUN_CRASHED. With n > 1 such suspects the crash cannot be blamed on one document: each
--   gets its attempt back and a cap of greatest(1, n / 2) tasks on its next run, so retries bisect the batch.
--   The grant is made only when it lowers the task's cap, so a task gets at most log2(n) + 1 of them. A lone
--   suspect's attempt counts: a poison document ends DEAD while its batch-mates succeed.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.task_id, l.attempt
    FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[]) AS l (task_id, attempt)
),
suspects AS (
    SELECT t.task_id, t.run_size_cap, t.lease_reserved AS reserved,
           t.lease_reserved AND t.reservation_givebacks >= %(giveback_limit)s AS abandoned
    FROM index_task t
    JOIN leases l ON l.task_id = t.task_id AND t.attempts = l.attempt
    WHERE t.status = 'RUNNING'
      AND ((t.lease_reserved AND t.lease_owner = %(owner)s)
           OR (NOT t.lease_reserved AND t.lease_owner = %(run_owner)s))
    ORDER BY t.task_id
    FOR UPDATE OF t
),
verdict AS (
    SELECT s.task_id, s.reserved, s.abandoned, n.n,
           (NOT s.reserved AND n.n > 1 AND greatest(1, n.n / 2) < coalesce(s.run_size_cap, n.n)) AS granted
    FROM suspects s, (SELECT count(*)::int AS n FROM suspects WHERE NOT reserved) n
),
judged AS (
    SELECT v.*,
           CASE WHEN v.abandoned THEN 'DEAD'
                WHEN v.reserved THEN 'RETRY_WAIT'
                WHEN %(retryable)s AND (t.attempts < t.max_attempts OR v.granted) THEN 'RETRY_WAIT'
                ELSE 'DEAD' END AS to_status
    FROM verdict v JOIN index_task t ON t.task_id = v.task_id
),
moved AS (
    UPDATE index_task t
    SET max_attempts          = t.max_attempts + CASE WHEN j.granted OR (j.reserved AND NOT j.abandoned) THEN 1 ELSE 0 END,
        reservation_givebacks = t.reservation_givebacks + CASE WHEN j.reserved AND NOT j.abandoned THEN 1 ELSE 0 END,
        lease_reserved        = false,
        run_size_cap          = CASE WHEN j.granted THEN greatest(1, j.n / 2) ELSE t.run_size_cap END,
        status                = j.to_status,
        next_attempt_at       = CASE WHEN j.to_status = 'RETRY_WAIT' THEN (SELECT now FROM clock)
                                     ELSE t.next_attempt_at END,
        finished_at           = CASE WHEN j.to_status = 'RETRY_WAIT' THEN NULL ELSE (SELECT now FROM clock) END,
        lease_owner           = NULL,
        lease_until           = NULL,
        error_code            = CASE WHEN j.abandoned THEN 'RUN_NEVER_STARTED'
                                     WHEN j.reserved THEN t.error_code ELSE %(code)s END,
        error_message         = CASE WHEN j.abandoned THEN %(never_started_message)s
                                     WHEN j.reserved THEN t.error_message
                                     WHEN j.granted
                                     THEN %(message)s || ' (one of ' || j.n || ' tasks in the run: attempt not'
                                          || ' counted; its next run has at most ' || greatest(1, j.n / 2) || ')'
                                     ELSE %(message)s END,
        updated_at            = (SELECT now FROM clock)
    FROM judged j
    WHERE t.task_id = j.task_id
    RETURNING t.task_id, t.status, t.attempts, t.stage, t.run_size_cap, t.error_code, t.error_message,
              j.reserved AND NOT j.abandoned AS given_back
),
logged AS (
    INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, error_code, message, created_at)
    SELECT m.task_id, 'transition', m.attempts, 'RUNNING', m.status, m.stage,
           CASE WHEN m.given_back THEN NULL ELSE m.error_code END,
           CASE WHEN m.given_back THEN 'its run ended before starting it: attempt given back'
                ELSE m.error_message END,
           (SELECT now FROM clock)
    FROM moved m
)
SELECT m.task_id, m.status, m.run_size_cap, m.given_back FROM moved m ORDER BY m.task_id;

-- name: lease_runs_to_release
-- Which runs (by index into the arrays) can do nothing useful any more and should give their run slot back.
-- A run's lease is reserved under its tick's owner (%(owners)s) until the run adopts it, then held under the
-- run's own owner (%(run_owners)s). A lease is
--   held  while still reserved (adoptable, even past lease_until, until a claim takes it over), or held (by the
--         run, or by a worker that handed it on) and either unexpired or *busy*: its row is locked by another
--         transaction (the run's own publish holds it, and the heartbeat skips it meanwhile: the lease may run
--         out while that transaction commits);
--   lost  when taken over (attempts moved on, another owner) or expired unrenewed and not busy.
-- A run is released when it holds none of its leases and lost one: a queued run whose reservations were all
-- taken over (it would pin its keys and start only to adopt nothing), or a started run that stopped
-- heartbeating. A lease finished on its attempt (SUCCEEDED, failed, cancelled) is neither held nor lost, so a
-- run finishing normally, or a re-execution of a finished run (it fails on its own, building nothing), is
-- never released here; that stays so once a later attempt took a task this run failed (RETRY_WAIT, then claimed
-- again): its attempt ended with a transition event of its own, which a takeover (RUNNING -> RUNNING) is not.
-- (Without that, a run of 104 whose 6 failed tasks were retried elsewhere before it ended was canceled as it
-- finished, and shown CANCELED after succeeding.) The event probe runs only for leases whose attempt moved on.
WITH
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
leases AS (
    SELECT l.run_ix, l.task_id, l.attempt, l.owner, l.run_owner
    FROM unnest(%(run_ixs)s::integer[], %(task_ids)s::bigint[], %(attempts)s::integer[], %(owners)s::text[],
                %(run_owners)s::text[])
         AS l (run_ix, task_id, attempt, owner, run_owner)
),
-- Held leases past their lease_until: normally none. Probed for a row lock without waiting (KEY SHARE
-- conflicts only with the publish's FOR UPDATE; the probe writes nothing the heartbeat waits on).
overdue AS (
    SELECT t.task_id
    FROM index_task t
    JOIN leases l ON l.task_id = t.task_id
    WHERE t.status = 'RUNNING' AND t.attempts = l.attempt AND NOT t.lease_reserved
      AND t.lease_owner IN (l.owner, l.run_owner) AND t.lease_until <= (SELECT now FROM clock)
),
unlocked AS (
    SELECT t.task_id
    FROM index_task t
    WHERE t.task_id IN (SELECT task_id FROM overdue)
    FOR KEY SHARE OF t SKIP LOCKED
),
moved_on AS (
    SELECT l.task_id, l.attempt
    FROM leases l
    JOIN index_task t ON t.task_id = l.task_id
    WHERE t.attempts <> l.attempt
),
ended_on_attempt AS (
    SELECT m.task_id, m.attempt
    FROM moved_on m
    WHERE EXISTS (SELECT 1 FROM task_event e
                  WHERE e.task_id = m.task_id AND e.kind = 'transition' AND e.attempt = m.attempt
                    AND e.from_status = 'RUNNING' AND e.to_status IN ('SUCCEEDED', 'RETRY_WAIT', 'DEAD', 'CANCELLED'))
),
judged AS (
    SELECT l.run_ix,
           coalesce(t.status = 'RUNNING' AND t.attempts = l.attempt
                    AND ((t.lease_reserved AND t.lease_owner = l.owner)
                         OR (NOT t.lease_reserved AND t.lease_owner IN (l.owner, l.run_owner)
                             AND (t.lease_until > (SELECT now FROM clock)
                                  OR t.task_id NOT IN (SELECT task_id FROM unlocked)))), false) AS held,
           coalesce(CASE WHEN t.attempts <> l.attempt
                         THEN (l.task_id, l.attempt) NOT IN (SELECT task_id, attempt FROM ended_on_attempt)
                         ELSE (t.status = 'RUNNING' AND t.lease_owner NOT IN (l.owner, l.run_owner))
                              OR (t.status = 'RUNNING' AND NOT t.lease_reserved
                                  AND t.lease_until <= (SELECT now FROM clock)
                                  AND t.task_id IN (SELECT task_id FROM unlocked)) END, true) AS lost
    FROM leases l
    LEFT JOIN index_task t ON t.task_id = l.task_id
)
SELECT j.run_ix
FROM judged j
GROUP BY j.run_ix
HAVING NOT bool_or(j.held) AND bool_or(j.lost)
ORDER BY j.run_ix;

-- name: listen_task_event
-- Subscribe this connection to the task_event trigger's wake-ups (the payload is the newest event id): the
-- API's SSE hub, and the claiming sensor waiting for a publish between its claims.
LISTEN kbindex_task_event;
