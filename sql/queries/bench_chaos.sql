-- Statements used only by the chaos soak (bench/chaos), never by the product: the bench's own bookkeeping, fault
-- targeting and end-state figures, on the kbindex database (Dagster's storage: bench_dagster.sql).

-- name: bench_chaos_busy_sessions
-- Benchmark only (bench/chaos busy_sessions, PostgreSQL's own view): the sessions of every database that are not
-- idle, for a round that timed out: a session waiting on a lock (or idle in a transaction holding one) shows where
-- a stalled daemon waits.
SELECT pid, datname, application_name, state, wait_event_type, wait_event,
       now() - xact_start, now() - state_change, pg_blocking_pids(pid), left(query, 200)
FROM pg_stat_activity
WHERE state IS DISTINCT FROM 'idle' AND pid <> pg_backend_pid() AND backend_type = 'client backend';

-- name: bench_chaos_active_profile
-- Benchmark only (bench/chaos): the active profile and its model, which the runs and the reader embed with.
SELECT name, model FROM index_profile WHERE is_active;

-- name: bench_chaos_remote_profile
-- Benchmark only (bench/chaos --http-provider): the active profile embeds through the bench's fake HTTP provider.
UPDATE index_profile
SET model = %(model)s, provider_url = %(url)s, provider_model = 'fake-remote', requests_per_minute = %(rpm)s,
    max_batch = 16
WHERE is_active;

-- name: bench_chaos_tasks_by_status
-- Benchmark only (bench/chaos): how many tasks are in each status (the progress line, quiescence).
SELECT status, count(*) FROM index_task GROUP BY status;

-- name: bench_chaos_held_tasks
-- Benchmark only (bench/chaos fault injector): (task, attempt, stage) of the tasks a run holds on its own lease.
SELECT task_id, attempts, stage FROM index_task WHERE status = 'RUNNING' AND lease_owner = %(owner)s;

-- name: bench_chaos_succeeded_ids
-- Benchmark only (bench/chaos publisher): every SUCCEEDED task, to pick versions already indexed to build on.
SELECT task_id FROM index_task WHERE status = 'SUCCEEDED';

-- name: bench_chaos_unfinished_publishes
-- Benchmark only (bench/chaos publisher): unfinished publish tasks, the backlog it keeps (a migration's REINDEX
-- tasks are the backfill's, and must not stop new versions from being published meanwhile).
SELECT count(*) FROM index_task WHERE status NOT IN ('SUCCEEDED', 'DEAD', 'CANCELLED') AND task_type <> 'REINDEX';

-- name: bench_chaos_finished_count
-- Benchmark only (bench/chaos fault injector): how many tasks have ended, to time faults along the round.
SELECT count(*) FROM index_task WHERE status IN ('SUCCEEDED', 'DEAD', 'CANCELLED');

-- name: bench_chaos_leases_moved_on
-- Benchmark only (bench/chaos): of the leases held at a fault, (task, attempt) in parallel arrays, how many moved
-- on (a later attempt, or the task left RUNNING), and how many there are.
SELECT count(*) FILTER (WHERE t.attempts > l.attempt OR t.status <> 'RUNNING'), count(*)
FROM index_task t
JOIN unnest(%(task_ids)s::bigint[], %(attempts)s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id;

-- name: bench_chaos_leases_taken_over
-- Benchmark only (bench/chaos SIGSTOP): of the leases a stopped run held, how many a later attempt took over.
SELECT count(*)
FROM index_task t
JOIN unnest(%(task_ids)s::bigint[], %(attempts)s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id
WHERE t.attempts > l.attempt;

-- name: bench_chaos_leases_moved_on_as
-- Benchmark only (bench/chaos/network.py): where the leases held at a cut went, by status and whether a later
-- attempt took the task.
SELECT t.status, t.attempts > l.attempt, count(*)
FROM index_task t
JOIN unnest(%(task_ids)s::bigint[], %(attempts)s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: bench_chaos_leases_later_and_taken_over
-- Benchmark only (bench/chaos/network.py): of the leases held at a cut, how many tasks a later attempt has, and how
-- many of those a claim took over (a RUNNING -> RUNNING transition past the held attempt); the rest were retried.
SELECT count(*) FILTER (WHERE t.attempts > l.attempt),
       count(*) FILTER (WHERE EXISTS (
           SELECT 1 FROM task_event e
           WHERE e.task_id = t.task_id AND e.kind = 'transition'
             AND e.from_status = 'RUNNING' AND e.to_status = 'RUNNING' AND e.attempt > l.attempt))
FROM index_task t
JOIN unnest(%(task_ids)s::bigint[], %(attempts)s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id;

-- name: bench_chaos_running_tasks
-- Benchmark only (bench/chaos/network.py): (task, attempt, stage, reserved) of every RUNNING task, to time a cut.
SELECT task_id, attempts, stage, lease_reserved FROM index_task WHERE status = 'RUNNING';

-- name: bench_chaos_succeeded_and_takeovers
-- Benchmark only (bench/chaos/network.py lossy link): SUCCEEDED tasks and takeovers (RUNNING -> RUNNING claim
-- transitions, as the report counts them) so far, before and after the loss.
SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'),
       (SELECT count(*) FROM task_event WHERE kind = 'transition' AND from_status = 'RUNNING' AND to_status = 'RUNNING')
FROM index_task;

-- name: bench_chaos_pointers
-- Benchmark only (bench/chaos reader): each document's pointer under the active profile, read before and after a
-- search as shipped (pointers only move forward, so a correct hit lies between).
SELECT p.document_id, p.version_number, p.chunk_count
FROM search_pointer p
JOIN index_profile ip ON ip.name = p.profile AND ip.is_active
WHERE p.tenant_id = %(tenant)s;

-- name: bench_chaos_pointed_rows
-- Benchmark only (bench/chaos reader, strict check): the pointers of the hit documents and the chunk rows of each
-- pointed version, read in the search's own REPEATABLE READ snapshot.
SELECT p.document_id, p.version_number, p.chunk_count,
       (SELECT count(*) FROM chunk c
        WHERE (c.tenant_id, c.document_id, c.profile, c.version_number)
            = (p.tenant_id, p.document_id, p.profile, p.version_number)) AS rows
FROM search_pointer p
JOIN index_profile ip ON ip.name = p.profile AND ip.is_active
WHERE p.tenant_id = %(tenant)s AND p.document_id = ANY(%(document_ids)s);

-- name: bench_chaos_task_count
-- Benchmark only (bench/chaos report): how many tasks there are.
SELECT count(*) FROM index_task;

-- name: bench_chaos_version_count
-- Benchmark only (bench/chaos report): how many versions there are.
SELECT count(*) FROM document_version;

-- name: bench_chaos_final_states
-- Benchmark only (bench/chaos report): tasks by final status and code.
SELECT status, error_code, count(*) FROM index_task GROUP BY 1, 2 ORDER BY 1, 2;

-- name: bench_chaos_failure_codes
-- Benchmark only (bench/chaos report): failures only, by code: a claim's event carries the task's last error code
-- along, so count the transitions out of RUNNING into RETRY_WAIT, DEAD or PENDING (fenced fail, crash recorder,
-- exhausted lease).
SELECT error_code, count(*)
FROM task_event
WHERE kind = 'transition' AND from_status = 'RUNNING' AND to_status IN ('RETRY_WAIT', 'DEAD', 'PENDING')
  AND error_code IS NOT NULL
GROUP BY 1
ORDER BY 1;

-- name: bench_chaos_transitions
-- Benchmark only (bench/chaos report): task transitions by (from, to) status; RUNNING -> RUNNING are takeovers.
SELECT from_status, to_status, count(*) FROM task_event WHERE kind = 'transition' GROUP BY 1, 2 ORDER BY 1, 2;

-- name: bench_chaos_stale_writes
-- Benchmark only (bench/chaos report, must be 0): writes from a superseded lease, task events carrying an attempt
-- lower than an earlier event of the same task.
SELECT count(*)
FROM (SELECT e.attempt,
             max(e.attempt) OVER (PARTITION BY e.task_id ORDER BY e.event_id
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS seen
      FROM task_event e) x
WHERE x.attempt < x.seen;

-- name: bench_chaos_retries
-- Benchmark only (bench/chaos report): attempts beyond each task's first.
SELECT coalesce(sum(greatest(attempts - 1, 0)), 0) FROM index_task;

-- name: bench_chaos_duplicate_ordinals
-- Benchmark only (bench/chaos report, must be 0): chunk ordinals written twice for one version and profile.
SELECT count(*)
FROM (SELECT 1 FROM chunk GROUP BY tenant_id, document_id, profile, version_number, ordinal HAVING count(*) > 1) d;

-- name: bench_chaos_pointed_rows_wrong
-- Benchmark only (bench/chaos report, must be 0): pointed versions whose chunk rows are not the count the pointer
-- recorded, or whose ordinals are not exactly 0..n-1.
SELECT count(*)
FROM (SELECT p.chunk_count, count(c.chunk_id) AS n, count(DISTINCT c.ordinal) AS d,
             min(c.ordinal) AS lo, max(c.ordinal) AS hi
      FROM search_pointer p
      LEFT JOIN chunk c
        ON (c.tenant_id, c.document_id, c.profile, c.version_number)
         = (p.tenant_id, p.document_id, p.profile, p.version_number)
      GROUP BY p.tenant_id, p.document_id, p.profile, p.chunk_count) x
WHERE n <> chunk_count OR d <> n OR (n > 0 AND (lo <> 0 OR hi <> n - 1));

-- name: bench_chaos_lost_publishes
-- Benchmark only (bench/chaos report, must be 0): of the publishes the bench recorded (task, tenant, document,
-- version in parallel arrays), those whose task is missing, names another version or has not ended.
SELECT count(*)
FROM unnest(%(task_ids)s::bigint[], %(tenants)s::text[], %(document_ids)s::text[], %(versions)s::int[])
     AS l(task_id, tenant, doc, version)
LEFT JOIN index_task t
  ON t.task_id = l.task_id AND (t.tenant_id, t.document_id, t.version_number) = (l.tenant, l.doc, l.version)
WHERE t.task_id IS NULL OR t.status NOT IN ('SUCCEEDED', 'DEAD', 'CANCELLED');

-- name: bench_chaos_unfinished
-- Benchmark only (bench/chaos report, must be 0): tasks of any type that have not ended.
SELECT count(*) FROM index_task WHERE status NOT IN ('SUCCEEDED', 'DEAD', 'CANCELLED');

-- name: bench_chaos_versions_without_task
-- Benchmark only (bench/chaos report, must be 0): versions with no task under the active profile.
SELECT count(*)
FROM document_version v
WHERE NOT EXISTS (SELECT 1 FROM index_task t JOIN index_profile ip ON ip.name = t.profile AND ip.is_active
                  WHERE (t.tenant_id, t.document_id, t.version_number) = (v.tenant_id, v.document_id, v.version_number));

-- name: bench_chaos_pointer_not_newest_succeeded
-- Benchmark only (bench/chaos report, must be 0): documents whose newest SUCCEEDED version (per profile) is not the
-- one their pointer names.
SELECT count(*)
FROM (SELECT t.tenant_id, t.document_id, t.profile, max(t.version_number) AS newest
      FROM index_task t WHERE t.status = 'SUCCEEDED' GROUP BY 1, 2, 3) s
LEFT JOIN search_pointer p ON (p.tenant_id, p.document_id, p.profile) = (s.tenant_id, s.document_id, s.profile)
WHERE p.version_number IS DISTINCT FROM s.newest;

-- name: bench_chaos_dead_without_code
-- Benchmark only (bench/chaos report, must be 0): DEAD tasks that say no why.
SELECT count(*) FROM index_task WHERE status = 'DEAD' AND error_code IS NULL;

-- name: bench_chaos_succeeded_of
-- Benchmark only (bench/chaos report): which of these tasks SUCCEEDED (revived documents indexed at the end).
SELECT task_id FROM index_task WHERE status = 'SUCCEEDED' AND task_id = ANY(%(task_ids)s::bigint[]);

-- name: bench_chaos_tombstone_task_states
-- Benchmark only (bench/chaos report): the tasks of tombstone versions (deletes) by final status and code.
SELECT t.status, t.error_code, count(*)
FROM index_task t
JOIN document_version v
  ON (v.tenant_id, v.document_id, v.version_number) = (t.tenant_id, t.document_id, t.version_number)
WHERE v.kind = 'tombstone'
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: bench_chaos_newest_versions
-- Benchmark only (bench/chaos/end_state.py): each document's newest version and its kind (content or tombstone).
SELECT DISTINCT ON (tenant_id, document_id) tenant_id, document_id, version_number, kind
FROM document_version
ORDER BY tenant_id, document_id, version_number DESC;

-- name: bench_chaos_newest_version_pointers
-- Benchmark only (bench/chaos/end_state.py): each document's newest version with, per profile of its tasks,
-- whether one SUCCEEDED, the lowest status and code, and where the profile's pointer is.
WITH newest AS (
    SELECT DISTINCT ON (tenant_id, document_id) tenant_id, document_id, version_number, kind
    FROM document_version ORDER BY tenant_id, document_id, version_number DESC)
SELECT n.tenant_id, n.document_id, n.version_number, n.kind, t.profile,
       bool_or(t.status = 'SUCCEEDED'), min(t.status), min(t.error_code), min(p.version_number)
FROM newest n
JOIN index_task t ON (t.tenant_id, t.document_id, t.version_number) = (n.tenant_id, n.document_id, n.version_number)
LEFT JOIN search_pointer p ON (p.tenant_id, p.document_id, p.profile) = (n.tenant_id, n.document_id, t.profile)
GROUP BY 1, 2, 3, 4, 5;

-- name: bench_chaos_pointed_versions
-- Benchmark only (bench/chaos/end_state.py search sweep): each pointer of these tenants under the active profile,
-- with the pointed version's kind and recorded chunk count.
SELECT p.tenant_id, p.document_id, p.version_number, v.kind, p.chunk_count
FROM search_pointer p
JOIN index_profile ip ON ip.name = p.profile AND ip.is_active
JOIN document_version v
  ON (v.tenant_id, v.document_id, v.version_number) = (p.tenant_id, p.document_id, p.version_number)
WHERE p.tenant_id = ANY(%(tenants)s);

-- name: bench_chaos_unattempted_reindex_keys
-- Benchmark only (bench/chaos/migration.py): the partition keys of the profile's REINDEX tasks no run has claimed
-- yet, in task order.
SELECT v.partition_key
FROM index_task t
JOIN document_version v USING (tenant_id, document_id, version_number)
WHERE t.profile = %(profile)s AND t.task_type = 'REINDEX' AND t.status = 'PENDING' AND t.attempts = 0
ORDER BY t.task_id;

-- name: bench_chaos_profile_models
-- Benchmark only (bench/chaos/migration.py): these profiles' models and chunk sizes.
SELECT name, model, chunk_tokens FROM index_profile WHERE name = ANY(%(profiles)s);

-- name: bench_chaos_chunk_texts
-- Benchmark only (bench/chaos/migration.py): every chunk text of these profiles, to recount its tokens.
SELECT profile, heading_path, text, token_count FROM chunk WHERE profile = ANY(%(profiles)s);

-- name: bench_chaos_chunk_sample
-- Benchmark only (bench/chaos/migration.py): a seeded sample of up to %(sample)s chunks per profile with their
-- vectors, to check each was embedded by its own profile's model.
SELECT profile, heading_path, text, embedding
FROM (SELECT c.*, row_number() OVER (PARTITION BY c.profile ORDER BY md5(c.chunk_id || %(seed)s)) AS r
      FROM chunk c WHERE c.profile = ANY(%(profiles)s)) x
WHERE r <= %(sample)s;

-- name: bench_chaos_dead_by_profile
-- Benchmark only (bench/chaos/migration.py): DEAD tasks by profile, type and code, and how many of them no run
-- ever started (no run or progress event, no lease owner run-...).
SELECT t.profile, t.task_type, t.error_code, count(*),
       count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM task_event e WHERE e.task_id = t.task_id
                                          AND (e.kind IN ('run', 'progress') OR e.lease_owner LIKE 'run-%%')))
FROM index_task t
WHERE t.status = 'DEAD'
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

-- name: bench_chaos_states_by_profile
-- Benchmark only (bench/chaos/migration.py): tasks by profile, type and status, with the most attempts one took.
SELECT profile, task_type, status, count(*), max(attempts) FROM index_task GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;

-- name: bench_chaos_source_version_counts
-- Benchmark only (bench/chaos/sources.py): how many versions each document of the source's tenant has.
SELECT document_id, count(*) FROM document_version WHERE tenant_id = %(tenant)s GROUP BY 1;

-- name: bench_chaos_source_newest
-- Benchmark only (bench/chaos/sources.py): each document's newest version of the source's tenant, its kind and hash.
SELECT DISTINCT ON (document_id) document_id, version_number, kind, content_hash
FROM document_version
WHERE tenant_id = %(tenant)s
ORDER BY document_id, version_number DESC;
