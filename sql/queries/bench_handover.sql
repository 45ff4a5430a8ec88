-- Statements used only by the handover bench (bench/handover, a chaos round of one-version runs), never by the
-- product: its figures from task_event and index_task, on the kbindex database.

-- name: bench_handover_waiting_takeovers
-- Benchmark only (bench/handover): claims that took over a lease its previous claim granted and no run ever
-- adopted: (task, attempt).
SELECT c.task_id, c.attempt
FROM task_event c
CROSS JOIN LATERAL (
    SELECT p.event_id, p.attempt FROM task_event p
    WHERE p.task_id = c.task_id AND p.kind = 'transition' AND p.to_status = 'RUNNING' AND p.event_id < c.event_id
    ORDER BY p.event_id DESC LIMIT 1) prev
WHERE c.kind = 'transition' AND c.from_status = 'RUNNING' AND c.to_status = 'RUNNING'
  AND NOT EXISTS (SELECT 1 FROM task_event r WHERE r.task_id = c.task_id AND r.kind = 'run'
                  AND r.attempt = prev.attempt AND r.event_id > prev.event_id AND r.event_id < c.event_id);

-- name: bench_handover_claims_of_keys
-- Benchmark only (bench/handover): every claim of the tasks of these partition keys (to find a run's lease without
-- lease tags), in event order.
SELECT v.partition_key, e.task_id, e.attempt, e.lease_owner, extract(epoch FROM e.created_at)::float8
FROM document_version v
JOIN index_task t USING (tenant_id, document_id, version_number)
JOIN task_event e ON e.task_id = t.task_id AND e.kind = 'transition' AND e.to_status = 'RUNNING'
WHERE v.partition_key = ANY(%(keys)s)
ORDER BY e.event_id;

-- name: bench_handover_crashed_unstarted
-- Benchmark only (bench/handover): RUN_CRASHED failures of attempts no run ever started (events, tasks).
SELECT count(*), count(DISTINCT e.task_id)
FROM task_event e
WHERE e.kind = 'transition' AND e.error_code = 'RUN_CRASHED'
  AND e.from_status = 'RUNNING' AND e.to_status IN ('RETRY_WAIT', 'PENDING', 'DEAD')
  AND NOT EXISTS (SELECT 1 FROM task_event r WHERE r.task_id = e.task_id AND r.attempt = e.attempt AND r.kind = 'run');

-- name: bench_handover_crashed_all
-- Benchmark only (bench/handover): every RUN_CRASHED failure (events, tasks).
SELECT count(*), count(DISTINCT e.task_id)
FROM task_event e
WHERE e.kind = 'transition' AND e.error_code = 'RUN_CRASHED'
  AND e.from_status = 'RUNNING' AND e.to_status IN ('RETRY_WAIT', 'PENDING', 'DEAD');

-- name: bench_handover_open_publishes
-- Benchmark only (bench/handover): attempts a run (by its lease owner) took to the publish stage and never moved
-- on itself.
SELECT DISTINCT p.lease_owner, p.task_id, p.attempt
FROM task_event p
WHERE p.kind = 'progress' AND p.stage = 'publish' AND p.lease_owner = ANY(%(owners)s)
  AND NOT EXISTS (SELECT 1 FROM task_event t WHERE t.task_id = p.task_id AND t.attempt = p.attempt
                  AND t.kind = 'transition' AND t.lease_owner = p.lease_owner AND t.event_id > p.event_id);

-- name: bench_handover_attempts_exhausted
-- Benchmark only (bench/handover): tasks that ended DEAD because their lease attempts ran out.
SELECT count(*) FROM index_task WHERE status = 'DEAD' AND error_code = 'LEASE_ATTEMPTS_EXHAUSTED';

-- name: bench_handover_task_states
-- Benchmark only (bench/handover): tasks by status and code (the end state).
SELECT status, error_code, count(*) FROM index_task GROUP BY 1, 2;
